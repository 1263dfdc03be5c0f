"""Split one pickle file into chunk pickles of the same layout, in memory O(largest sample).

:func:`split` cuts ``BIG.pickle`` into ``OUT/BIG-00000.pickle``, ``OUT/BIG-00001.pickle``...:
each chunk is one ordinary pickle (plain :func:`pickle.load` reads it, and so does pickleshard's
scanner) of the source's layout and protocol holding a contiguous run of its samples, so that
loading the chunks in order and concatenating their samples gives the source's samples.

Layouts, as :mod:`pickleshard.layouts` names them, keep their containers: ``columns`` stays a
tuple or a list of fields, each field a list, a tuple or a numpy array (a chunk holds the
array's rows ``[a, b)``); ``dict_columns`` a dict with the same keys; ``rows`` a list of tuples;
``dict_rows`` a list of dicts. A file of appended pickles that are each a layout gives chunks of
that layout (one pickle each); a file of one sample per pickle gives chunks of one sample per
pickle. Dict keys are written as the scanner's field names (``str``). Protocols 0/1 are written
as protocol 2. Object identity between two *fields* of one sample of a column layout is not kept
(the values are equal); within one field, or one row, it is.

How a chunk is written without holding it: the container opcodes (``EMPTY_LIST``, ``MARK`` ...
``APPENDS``, ``TUPLE``, ``SETITEMS``) are written one by one, and each sample, read alone through
:class:`~pickleshard.spanread.SpanReader` (under the caller's :class:`UnpicklePolicy`), is saved
into the same stream by :class:`ChunkPickler`, a pure-Python pickler whose memo is emptied after
every sample while its memo ids keep counting (so a protocol 4+ ``MEMOIZE``, whose id is the
unpickler's count of stored entries, still names the id its ``GET`` s use). The rows of an
``array_row`` field are copied from the source file in blocks of ``COPY_BLOCK`` bytes straight
behind the array's payload opcode. Memory: the largest sample, one copy block, the scan's
per-sample arrays (``8 * (3F + 2)`` bytes a sample for F fields) and the pickler's frame (64 KiB).

Atomic and resumable: the plan (sample ranges and chunk names) is written first to
``OUT/pickleshard-split.json``; each chunk is written under a temporary name and renamed when
complete; the manifest is rewritten with ``"complete": true`` last. A rerun with the same source
(size and mtime) and limits keeps the finished chunks and writes the rest, or reports that the
split is already done.

A file the scanner refuses (:class:`~pickleshard.errors.NotSpanIndexableError`) is loaded whole
when ``WHOLE_FILE_FACTOR`` times its size fits ``memory_bytes``; otherwise :func:`split` raises
that error, naming the file, the scanner's reason and the budget.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, ClassVar

import numpy as np

from . import opcodes as oc
from .errors import (
    NotSpanIndexableError,
    OutputExistsError,
    OutputPathError,
    PickleshardError,
    UnreadableFileError,
    UnsupportedLayoutError,
)
from .layouts import decode_layout, default_field_names
from .safety import UnpicklePolicy
from .scan import ScanResult, scan_file
from .spanread import SpanReader
from .wholefile import load_file

__all__ = ["COPY_BLOCK", "MANIFEST", "WHOLE_FILE_FACTOR", "ChunkPickler", "SplitReport", "split"]

MANIFEST = "pickleshard-split.json"
COPY_BLOCK = 8 << 20
WHOLE_FILE_FACTOR = 3  # unpickled data takes 2-3x its file size
DEFAULT_MEMORY_BYTES = 1 << 30
_FORMAT = 1
_BATCH = 1000  # items per APPENDS / SETITEMS, as CPython's pickler writes them
_Q = struct.Struct("<Q").pack
_I = struct.Struct("<I").pack
_CLOSE_TUPLE = {0: pickle.EMPTY_TUPLE, 1: pickle.TUPLE1, 2: pickle.TUPLE2, 3: pickle.TUPLE3}


@dataclass(frozen=True)
class SplitReport:
    """What :func:`split` did: ``chunks`` are all the chunk files, in sample order."""

    source: Path
    out: Path
    chunks: list[Path]
    num_samples: int
    chunks_reused: int
    already_done: bool
    whole_file: bool
    bytes_written: int
    seconds: float


class _Payload:
    """Stands for the raw bytes of an array's rows; :class:`ChunkPickler` streams them."""

    def __init__(self, nbytes: int, fill: Callable[[Callable[[Any], Any]], None]) -> None:
        self.nbytes, self.fill = nbytes, fill


class ChunkPickler(pickle._Pickler):
    """One pickle stream written piece by piece: raw opcodes with :meth:`op`, whole values with
    :meth:`item` (the memo is emptied after each, memo ids keep counting), :meth:`finish`.

    A :class:`_Payload` value is written as a ``bytearray`` (protocol 5) or ``bytes`` payload,
    outside any frame, by its ``fill(write)``.
    """

    # pickle._Pickler's undocumented attributes, as its own code uses them
    memo: dict[int, tuple[int, Any]]
    proto: int
    framer: Any
    write: Callable[[bytes], Any]
    save: Callable[[Any], None]
    put: Callable[[int], bytes]
    save_reduce: Callable[..., None]
    _file_write: Callable[[Any], Any]

    def __init__(self, file: IO[bytes], protocol: int) -> None:
        super().__init__(file, protocol)
        self._next_id = 0
        self.write(pickle.PROTO + bytes((protocol,)))
        if protocol >= 4:
            self.framer.start_framing()

    def memoize(self, obj: Any) -> None:
        self.memo[id(obj)] = self._next_id, obj
        self.write(self.put(self._next_id))
        self._next_id += 1

    def op(self, code: bytes) -> None:
        self.write(code)

    def item(self, obj: Any) -> None:
        self.save(obj)
        self.memo.clear()

    def _save_payload(self, obj: _Payload) -> None:
        n = obj.nbytes
        if self.proto >= 5:
            head = pickle.BYTEARRAY8 + _Q(n)
        elif n < 256:
            head = pickle.SHORT_BINBYTES + bytes((n,))
        elif n < 1 << 32:
            head = pickle.BINBYTES + _I(n)
        elif self.proto >= 4:
            head = pickle.BINBYTES8 + _Q(n)
        else:
            raise ValueError(f"protocol {self.proto} cannot hold {n} bytes in one payload")
        if self.proto >= 4:
            self.framer.commit_frame(force=True)
        self._file_write(head)
        obj.fill(self._file_write)

    def finish(self) -> None:
        self.write(pickle.STOP)
        if self.proto >= 4:
            self.framer.end_framing()

    dispatch: ClassVar[dict[type, Callable[..., Any]]] = {
        **pickle._Pickler.dispatch,
        _Payload: _save_payload,
    }


def _write_items(p: ChunkPickler, items: Iterable[Any], close: bytes) -> None:
    """``MARK item... close`` per batch of up to 1000 (one item: ``item close_one``)."""
    batch: list[Any] = []
    for x in items:
        batch.append(x)
        if len(batch) == _BATCH:
            _flush(p, batch, close)
    if batch:
        _flush(p, batch, close)


def _flush(p: ChunkPickler, batch: list[Any], close: bytes) -> None:
    one = {pickle.APPENDS: pickle.APPEND, pickle.SETITEMS: pickle.SETITEM}[close]
    if close == pickle.APPENDS and len(batch) == 1:
        p.item(batch[0])
        p.op(one)
    else:
        p.op(pickle.MARK)
        for x in batch:
            p.item(x)
        p.op(close)
    batch.clear()


def _write_tuple(p: ChunkPickler, items: Iterable[Any], n: int) -> None:
    if n in _CLOSE_TUPLE:
        for x in items:
            p.item(x)
        p.op(_CLOSE_TUPLE[n])
    else:
        p.op(pickle.MARK)
        for x in items:
            p.item(x)
        p.op(pickle.TUPLE)


@dataclass(frozen=True)
class _Shape:
    """How the source's samples sit in a chunk: ``kind`` is a layout name, ``samples`` (one per
    pickle) or ``dict_samples``; ``top`` is ``tuple``/``list``/``dict``; ``containers`` per field
    ``list``/``tuple``/``array``; ``dtypes`` the array fields' dtypes as stored."""

    kind: str
    top: str
    fields: tuple[str, ...]
    containers: tuple[str, ...]
    dtypes: tuple[np.dtype[Any] | None, ...]
    tuple_samples: bool = True


class _Source:
    """Samples of the file being split: ``value(f, i)``, ``sample(i)``, ``rows(f, a, b)``."""

    num_samples: int
    protocol: int

    def value(self, f: int, i: int) -> Any:
        raise NotImplementedError

    def sample(self, i: int) -> tuple[Any, ...]:
        raise NotImplementedError

    def row_shape(self, f: int) -> tuple[int, ...]:
        raise NotImplementedError

    def rows(self, f: int, a: int, b: int) -> Any:
        """Rows ``[a, b)`` of array field ``f``: a :class:`_Payload`, or an array."""
        raise NotImplementedError

    def sizes(self) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _SpanSource(_Source):
    """Reads through :class:`SpanReader`; one reader per field, over a one-field view of the
    scan, so writing a column reads only that column."""

    def __init__(self, scan: ScanResult, policy: UnpicklePolicy) -> None:
        self.scan, self.num_samples, self.protocol = scan, scan.num_samples, scan.protocol
        find = _find_class(policy, scan.path)
        kw: dict[str, Any] = {"encoding": policy.encoding, "find_class": find}
        self.reader = SpanReader(scan, **kw)
        self.field_readers = [
            SpanReader(_field_view(scan, f), **kw) if k == "pickle" else None
            for f, k in enumerate(scan.kinds)
        ]
        self._fd = os.open(scan.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def value(self, f: int, i: int) -> Any:
        r = self.field_readers[f]
        assert r is not None
        return r.read_sample(i)[0]

    def sample(self, i: int) -> tuple[Any, ...]:
        return self.reader.read_sample(i)

    def row_shape(self, f: int) -> tuple[int, ...]:
        spec = self.scan.arrays[f]
        assert spec is not None
        return spec.row_shape

    def rows(self, f: int, a: int, b: int) -> _Payload:
        spec = self.scan.arrays[f]
        assert spec is not None
        start, n = int(self.scan.starts[a, f]) if b > a else 0, (b - a) * spec.nbytes
        fd, path = self._fd, self.scan.path

        def fill(write: Callable[[Any], Any]) -> None:
            done = 0
            while done < n:
                block = os.pread(fd, min(COPY_BLOCK, n - done), start + done)
                if not block:
                    raise NotSpanIndexableError(path, "file ends inside an array field")
                write(block)
                done += len(block)

        return _Payload(n, fill)

    def sizes(self) -> np.ndarray:
        return np.asarray((self.scan.ends - self.scan.starts).sum(axis=1), np.int64)

    def close(self) -> None:
        for r in (self.reader, *self.field_readers):
            if r is not None:
                r.close()
        os.close(self._fd)


class _LoadedSource(_Source):
    """A file loaded whole (the scanner refused it): its columns in memory."""

    def __init__(self, columns: Sequence[Any], protocol: int) -> None:
        self.columns, self.protocol = columns, protocol
        self.num_samples = len(columns[0]) if columns else 0

    def value(self, f: int, i: int) -> Any:
        return self.columns[f][i]

    def sample(self, i: int) -> tuple[Any, ...]:
        return tuple(c[i] for c in self.columns)

    def row_shape(self, f: int) -> tuple[int, ...]:
        return tuple(np.shape(self.columns[f])[1:])

    def rows(self, f: int, a: int, b: int) -> Any:
        return self.columns[f][a:b]  # in memory already: pickled as an ndarray

    def sizes(self) -> np.ndarray:
        return np.fromiter(
            (len(pickle.dumps(self.sample(i), self.protocol)) for i in range(self.num_samples)),
            np.int64,
            self.num_samples,
        )


def _find_class(policy: UnpicklePolicy, path: str) -> Callable[[str, str], Any] | None:
    """The policy's global lookup (None: any global, the unpickler's own)."""
    if policy.trusted:
        return None
    return policy.unpickler(io.BytesIO(), path).find_class


def _field_view(scan: ScanResult, f: int) -> ScanResult:
    """``scan`` with field ``f`` alone (its externals re-sliced)."""
    n, nf = scan.starts.shape
    counts = np.diff(scan.ext_offsets).reshape(n, nf)[:, f]
    firsts = scan.ext_offsets[:-1].reshape(n, nf)[:, f]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    take = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts)
    take += np.repeat(firsts, counts)
    return replace(
        scan,
        fields=(scan.fields[f],),
        kinds=(scan.kinds[f],),
        arrays=(scan.arrays[f],),
        starts=scan.starts[:, f : f + 1],
        ends=scan.ends[:, f : f + 1],
        memo_base=scan.memo_base[:, f : f + 1],
        ext_offsets=offsets,
        ext_keys=scan.ext_keys[take],
    )


# the opcode that completes a list, tuple or dict (the scanner's batch ends point at it)
_CLOSERS = {
    **dict.fromkeys(b"ea", "list"),
    **dict.fromkeys(b"t\x85\x86\x87", "tuple"),
    **dict.fromkeys(b"us", "dict"),
}


def _top_closer(tail: bytes) -> str:
    """The container a pickle's top-level object is, from the bytes that end at its ``STOP``:
    its closing opcode, maybe followed by a ``MEMOIZE``/``BINPUT``/``LONG_BINPUT``."""
    for close, memo, op in ((-7, -6, oc.LONG_BINPUT_OP), (-4, -3, oc.BINPUT_OP)):
        if len(tail) >= -close and tail[memo] == op and tail[close] in _CLOSERS:
            return _CLOSERS[tail[close]]
    if len(tail) >= 3 and tail[-2] == oc.MEMOIZE_OP and tail[-3] in _CLOSERS:
        return _CLOSERS[tail[-3]]
    return _CLOSERS.get(tail[-2], "") if len(tail) >= 2 else ""


def _shape_from_scan(scan: ScanResult) -> _Shape:
    """Container types of a scanned file, from the opcodes that close them (a few bytes each,
    read with ``pread``; no mapping of the file)."""
    layout = scan.layout.removeprefix("appended_")
    dtypes = tuple(
        None
        if a is None
        else (a.dtype.newbyteorder("S") if a.swap and a.dtype.byteorder != "|" else a.dtype)
        for a in scan.arrays
    )
    if layout in ("rows", "dict_rows"):
        return _Shape(layout, "list", scan.fields, (), dtypes)
    fd = os.open(scan.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        end = int(scan.records[0, 1])
        top = _top_closer(os.pread(fd, min(end, 8), end - min(end, 8)))
        if layout in ("samples", "dict_samples"):
            return _Shape(layout, "", scan.fields, (), dtypes, tuple_samples=top == "tuple")
        containers = []
        for f, kind in enumerate(scan.kinds):
            last = int(np.searchsorted(scan.starts[:, f], end)) - 1
            if kind == "array_row":
                containers.append("array")
            elif last < 0:
                containers.append("list")  # an empty field: no closing opcode to read
            else:
                op = os.pread(fd, 1, int(scan.ends[last, f]))
                containers.append(_CLOSERS.get(op[0], "?") if op else "?")
    finally:
        os.close(fd)
    if "?" in containers or top not in ("list", "tuple", "dict"):
        raise NotSpanIndexableError(scan.path, "a container whose type split cannot tell")
    return _Shape(layout, top, scan.fields, tuple(containers), dtypes)


def _shape_from_object(obj: Any, layout: str, fields: tuple[str, ...]) -> _Shape:
    if layout in ("rows", "dict_rows"):
        return _Shape(layout, "list", fields, (), (None,) * len(fields))
    cols = list(obj.values()) if isinstance(obj, dict) else list(obj)
    containers = tuple(
        "array" if isinstance(c, np.ndarray) else "tuple" if isinstance(c, tuple) else "list"
        for c in cols
    )
    dtypes = tuple(c.dtype if isinstance(c, np.ndarray) else None for c in cols)
    top = "dict" if isinstance(obj, dict) else "tuple" if isinstance(obj, tuple) else "list"
    return _Shape(layout, top, fields, containers, dtypes)


def _write_field(p: ChunkPickler, src: _Source, shape: _Shape, f: int, a: int, b: int) -> None:
    container = shape.containers[f]
    if container == "array":
        dtype = shape.dtypes[f]
        assert dtype is not None
        payload = src.rows(f, a, b)
        if not isinstance(payload, _Payload):
            p.item(payload)
            return
        row_shape = src.row_shape(f)
        template = np.zeros((1, *row_shape), dtype)
        reduced: Any = template.__reduce_ex__(p.proto)
        func, args, *state = reduced
        if p.proto >= 5 and len(args) == 4:
            p.save_reduce(func, (payload, args[1], (b - a, *row_shape), args[3]))
        else:
            version, _, dt, fortran, _ = state[0]
            p.save_reduce(func, args, state=(version, (b - a, *row_shape), dt, fortran, payload))
        p.memo.clear()
    elif container == "list":
        p.op(pickle.EMPTY_LIST)
        _write_items(p, (src.value(f, i) for i in range(a, b)), pickle.APPENDS)
    else:
        _write_tuple(p, (src.value(f, i) for i in range(a, b)), b - a)


def _write_chunk(fh: IO[bytes], src: _Source, shape: _Shape, a: int, b: int) -> None:
    protocol = max(src.protocol, 2)
    if shape.kind in ("samples", "dict_samples"):
        for i in range(a, b):
            s = src.sample(i)
            obj: Any = s if shape.tuple_samples else s[0]
            if shape.kind == "dict_samples":
                obj = dict(zip(shape.fields, s, strict=True))
            pickle.Pickler(fh, protocol).dump(obj)
        return
    p = ChunkPickler(fh, protocol)
    if shape.kind == "rows":
        p.op(pickle.EMPTY_LIST)
        _write_items(p, (src.sample(i) for i in range(a, b)), pickle.APPENDS)
    elif shape.kind == "dict_rows":
        p.op(pickle.EMPTY_LIST)
        rows = (dict(zip(shape.fields, src.sample(i), strict=True)) for i in range(a, b))
        _write_items(p, rows, pickle.APPENDS)
    else:
        nf = len(shape.fields)
        if shape.top == "dict":
            p.op(pickle.EMPTY_DICT + pickle.MARK)
        elif shape.top == "list":
            p.op(pickle.EMPTY_LIST + pickle.MARK)
        elif nf not in _CLOSE_TUPLE:
            p.op(pickle.MARK)
        for f, name in enumerate(shape.fields):
            if shape.top == "dict":
                p.item(name)
            _write_field(p, src, shape, f, a, b)
        if shape.top == "tuple":
            p.op(_CLOSE_TUPLE.get(nf, pickle.TUPLE))
        else:
            p.op(pickle.SETITEMS if shape.top == "dict" else pickle.APPENDS)
    p.finish()


def _boundaries(sizes: np.ndarray, max_bytes: int | None, max_samples: int | None) -> list[int]:
    """Chunk starts and the end: at most ``max_samples`` samples and, by the span sizes,
    ``max_bytes`` bytes a chunk (a sample larger than that is a chunk alone)."""
    n = len(sizes)
    cum = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    cuts, a = [0], 0
    while a < n:
        b = n if max_samples is None else min(n, a + max_samples)
        if max_bytes is not None:
            b = min(b, int(np.searchsorted(cum, cum[a] + max_bytes, "right")) - 1)
        b = max(b, a + 1)
        cuts.append(b)
        a = b
    return cuts


def _identity(path: Path, max_bytes: int | None, max_samples: int | None) -> dict[str, Any]:
    st = path.stat()
    return {
        "format": _FORMAT,
        "source": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "max_bytes": max_bytes,
        "max_samples": max_samples,
    }


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def _open_source(
    path: Path, policy: UnpicklePolicy, memory_bytes: int, scan: ScanResult | None
) -> tuple[_Source, _Shape, bool]:
    try:
        if scan is None:
            scan = scan_file(path, encoding=policy.encoding)
        elif scan.size != path.stat().st_size:
            raise ValueError(f"scan= is of a file of {scan.size} bytes, not of {path}")
    except NotSpanIndexableError as exc:
        need = WHOLE_FILE_FACTOR * path.stat().st_size
        if need > memory_bytes:
            raise NotSpanIndexableError(
                path,
                f"{exc.reason}; loading it whole instead needs about {need:,} bytes "
                f"({WHOLE_FILE_FACTOR}x its size), over the memory budget of {memory_bytes:,} "
                f"(memory_bytes=, CLI --memory-bytes)",
                offset=exc.offset,
            ) from None
        columns, shape = _load_whole(path, policy)
        return _LoadedSource(columns, _protocol_of(path)), shape, True
    src = _SpanSource(scan, policy)
    try:
        return src, _shape_from_scan(scan), False
    except BaseException:
        src.close()
        raise


def _load_whole(path: Path, policy: UnpicklePolicy) -> tuple[Sequence[Any], _Shape]:
    """Every pickle of ``path``, as columns, by the scanner's rules for appended pickles."""
    objs: list[Any] = []
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        while fh.tell() < size:
            try:
                objs.append(policy.unpickler(fh, path).load())
            except PickleshardError:
                raise
            except Exception:
                if not objs:
                    load_file(path, policy)  # raises the classified error
                raise
    if len(objs) == 1:
        decoded = decode_layout(objs[0], path)
        return decoded.columns, _shape_from_object(objs[0], decoded.layout, decoded.fields)
    try:
        parts = [decode_layout(o, path) for o in objs]
    except UnsupportedLayoutError:
        first = objs[0]
        if type(first) is tuple and first:
            fields = default_field_names(len(first))
            shape = _Shape("samples", "", fields, (), (None,) * len(fields))
            return tuple(zip(*objs, strict=True)), shape
        if type(first) is dict and first:
            keys = list(first)
            fields = tuple(str(k) for k in keys)
            shape = _Shape("dict_samples", "", fields, (), (None,) * len(fields))
            return tuple([o[k] for o in objs] for k in keys), shape
        return (objs,), _Shape("samples", "", ("x",), (), (None,), tuple_samples=False)
    columns = tuple(
        np.concatenate([p.columns[f] for p in parts])
        if all(isinstance(p.columns[f], np.ndarray) for p in parts)
        else [v for p in parts for v in p.columns[f]]
        for f in range(len(parts[0].fields))
    )
    shape = _shape_from_object(objs[0], parts[0].layout, parts[0].fields)
    if any(
        c == "array" and not isinstance(col, np.ndarray)
        for c, col in zip(shape.containers, columns, strict=False)
    ):
        shape = replace(shape, containers=tuple("list" for _ in shape.containers))
    return columns, shape


def _protocol_of(path: Path) -> int:
    with open(path, "rb") as fh:
        head = fh.read(2)
    return head[1] if len(head) == 2 and head[0] == oc.PROTO_OP else 0


def _chunk_names(stem: str, count: int) -> list[str]:
    width = max(5, len(str(max(count - 1, 0))))
    return [f"{stem}-{k:0{width}d}.pickle" for k in range(count)]


def split(
    src_file: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    max_samples: int | None = None,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    encoding: str = "ASCII",
    trusted: bool = False,
    allow_globals: Iterable[str] = (),
    overwrite: bool = False,
    scan: ScanResult | None = None,
) -> SplitReport:
    """Split ``src_file`` into chunk pickles in ``out_dir`` (see the module docstring).

    At least one of ``max_bytes`` (by the samples' pickled sizes in the source) and
    ``max_samples`` bounds each chunk. Samples are unpickled under the policy of ``trusted`` /
    ``allow_globals`` / ``encoding``. ``memory_bytes`` bounds the whole-file fallback.
    ``overwrite`` replaces the chunks of an earlier split with other limits or of another
    source version; without it that raises :class:`OutputExistsError`. ``scan`` is the file's
    :class:`~pickleshard.scan.ScanResult` if the caller has it (from an index): the scanner
    maps the whole file read-only, which needs address space (not memory) the size of the file.
    """
    if max_bytes is None and max_samples is None:
        raise ValueError("give max_bytes or max_samples")
    for name, v in (("max_bytes", max_bytes), ("max_samples", max_samples)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be at least 1, got {v}")
    t0 = time.perf_counter()
    path = Path(src_file).resolve()
    out = Path(out_dir)
    policy = UnpicklePolicy.from_args(
        trusted=trusted, allow_globals=allow_globals, encoding=encoding
    )
    try:
        ident = _identity(path, max_bytes, max_samples)
    except OSError as exc:
        raise UnreadableFileError(path, f"cannot read: {exc.strerror or exc}") from None
    manifest_path = out / MANIFEST
    old = _read_manifest(manifest_path)
    if old is not None and {k: old.get(k) for k in ident} != ident:
        if not overwrite:
            raise OutputExistsError(
                out,
                f"holds a split of {old.get('source')} with other limits or of another version "
                f"of the source; pass overwrite=True (CLI: --overwrite) to replace it",
            )
        for name in old.get("chunks", []):
            (out / name).unlink(missing_ok=True)
        manifest_path.unlink()
        old = None
    if old is not None and old.get("complete"):
        chunks = [out / n for n in old["chunks"]]
        return SplitReport(
            path, out, chunks, old["samples"], len(chunks), True, old["whole_file"], 0, 0.0
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(out, f"cannot create: {exc.strerror or exc}") from None
    src, shape, whole = _open_source(path, policy, memory_bytes, scan)
    try:
        if old is None:
            cuts = _boundaries(src.sizes(), max_bytes, max_samples)
            names = _chunk_names(path.stem, len(cuts) - 1)
            for name in names:
                if (out / name).exists():
                    raise OutputExistsError(out / name, "is in the way of a chunk of this split")
            manifest = {
                **ident,
                "layout": shape.kind,
                "samples": src.num_samples,
                "whole_file": whole,
                "cuts": cuts,
                "chunks": names,
                "complete": False,
            }
            _write_json(manifest_path, manifest)
        else:
            manifest = old
        cuts, names = manifest["cuts"], manifest["chunks"]
        written, reused = 0, 0
        for k, name in enumerate(names):
            final = out / name
            if final.exists():
                reused += 1
                continue
            written += _write_one(final, src, shape, cuts[k], cuts[k + 1])
    finally:
        src.close()
    _write_json(manifest_path, {**manifest, "complete": True})
    return SplitReport(
        path,
        out,
        [out / n for n in names],
        src.num_samples,
        reused,
        False,
        whole,
        written,
        time.perf_counter() - t0,
    )


def _write_one(final: Path, src: _Source, shape: _Shape, a: int, b: int) -> int:
    for stale in final.parent.glob(f"{final.name}.tmp-*"):
        stale.unlink(missing_ok=True)  # left by a killed run
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb", buffering=1 << 20) as fh:
            _write_chunk(fh, src, shape, a, b)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final.stat().st_size


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise OutputExistsError(path, f"is not a readable split manifest: {exc}") from None
    return obj if isinstance(obj, dict) else None
