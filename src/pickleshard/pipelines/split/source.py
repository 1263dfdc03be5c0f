"""Where :func:`pickleshard.pipelines.split.run.split` reads samples from, and the layout it writes.

:class:`SpanSource` reads a scanned file through :class:`~pickleshard.read.SpanReader`
under the caller's :class:`~pickleshard.safety.policy.UnpicklePolicy` (one reader per field over a
one-field view of the scan, so writing a column reads only that column), and copies the rows of
an ``array_row`` field from the file in blocks of ``COPY_BLOCK`` bytes. :func:`shape_from_scan`
tells the container types from the opcodes that close them (a few bytes each, read from the
file's :mod:`byte source <pickleshard.io>`; the file is not mapped). :class:`LoadedSource` holds a file the scanner refused, loaded whole by
:func:`open_source` when ``WHOLE_FILE_FACTOR`` times its size fits the memory budget.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import NotSpanIndexableError, UnsupportedLayoutError
from ...io import open_source as open_bytes
from ...io.identity import FileIdentity
from ...picklekit import opcodes as oc
from ...read import SpanReader
from ...read.whole.load import load_records
from ...safety.policy import UnpicklePolicy
from ...scan import ScanResult, scan_file
from ...scan.layouts import (
    APPENDED,
    DICT_SAMPLES,
    LAYOUT_TABLE,
    SAMPLES,
    decode_layout,
    default_field_names,
    layout_named,
)
from ...scan.records import decode_records
from .chunkwriter import ChunkShape, RowPayload, SampleSource

__all__ = [
    "COPY_BLOCK",
    "WHOLE_FILE_FACTOR",
    "LoadedSource",
    "SpanSource",
    "open_source",
    "shape_from_scan",
]

COPY_BLOCK = 8 << 20
WHOLE_FILE_FACTOR = 3  # unpickled data takes 2-3x its file size


class SpanSource(SampleSource):
    """Reads through :class:`SpanReader`; one reader per field, over a one-field view of the
    scan, so writing a column reads only that column. Every read, raw array rows too, relies on
    the file still being ``identity`` (default: of the scan's size)."""

    def __init__(
        self, scan: ScanResult, policy: UnpicklePolicy, identity: FileIdentity | None = None
    ) -> None:
        self.scan, self.num_samples, self.protocol = scan, scan.num_samples, scan.protocol
        self.policy = policy
        find = policy.find_class(scan.path)
        kw: dict[str, Any] = {"encoding": policy.encoding, "find_class": find, "identity": identity}
        self.reader = SpanReader(scan, **kw)
        self.field_readers = [
            SpanReader(_field_view(scan, f), **kw) if k == "pickle" else None
            for f, k in enumerate(scan.kinds)
        ]

    def value(self, f: int, i: int) -> Any:
        r = self.field_readers[f]
        assert r is not None
        value = r.read_sample(i)[0]
        self.policy.check_sample(value, self.scan.path, i)
        return value

    def sample(self, i: int) -> tuple[Any, ...]:
        sample = self.reader.read_sample(i)
        self.policy.check_sample(sample, self.scan.path, i)
        return sample

    def row_shape(self, f: int) -> tuple[int, ...]:
        spec = self.scan.arrays[f]
        assert spec is not None
        return spec.row_shape

    def rows(self, f: int, a: int, b: int) -> RowPayload:
        spec = self.scan.arrays[f]
        assert spec is not None
        start, n = int(self.scan.starts[a, f]) if b > a else 0, (b - a) * spec.nbytes
        reader, path = self.reader, self.scan.path

        def fill(write: Callable[[Any], Any]) -> None:
            done = 0
            while done < n:
                block = reader.read_raw(start + done, min(COPY_BLOCK, n - done))
                if not block:
                    raise NotSpanIndexableError(path, "file ends inside an array field")
                write(block)
                done += len(block)
            reader.check_identity(range(a, b))  # raw bytes: no framing says they are the old

        return RowPayload(n, fill)

    def sizes(self) -> np.ndarray:
        return np.asarray((self.scan.ends - self.scan.starts).sum(axis=1), np.int64)

    def close(self) -> None:
        for r in (self.reader, *self.field_readers):
            if r is not None:
                r.close()


class LoadedSource(SampleSource):
    """A file loaded whole (the scanner refused it): its columns in memory."""

    def __init__(
        self,
        columns: Sequence[Any],
        protocol: int,
        path: str | os.PathLike[str] = "",
        policy: UnpicklePolicy | None = None,
    ) -> None:
        self.columns, self.protocol = columns, protocol
        self.num_samples = len(columns[0]) if columns else 0
        self.path, self.policy = os.fspath(path), policy

    def value(self, f: int, i: int) -> Any:
        value = self.columns[f][i]
        if self.policy is not None:
            self.policy.check_sample(value, self.path, i)
        return value

    def sample(self, i: int) -> tuple[Any, ...]:
        sample = tuple(c[i] for c in self.columns)
        if self.policy is not None:
            self.policy.check_sample(sample, self.path, i)
        return sample

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
        items=(scan.items[f],) if scan.items else (),
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


def shape_from_scan(scan: ScanResult) -> ChunkShape:
    """Container types of a scanned file, from the opcodes that close them (a few bytes each,
    read from its byte source; no mapping of the file)."""
    entry = layout_named(scan.layout, scan.path)
    layout = entry.name
    dtypes = tuple(
        None
        if a is None
        else (a.dtype.newbyteorder("S") if a.swap and a.dtype.byteorder != "|" else a.dtype)
        for a in scan.arrays
    )
    if entry.rows:
        return ChunkShape(layout, "list", scan.fields, (), dtypes)
    with open_bytes(scan.path) as data:
        end = int(scan.records[0, 1])
        top = _top_closer(data.read_at(end - min(end, 8), min(end, 8)))
        if entry.per_pickle:
            return ChunkShape(layout, "", scan.fields, (), dtypes, tuple_samples=top == "tuple")
        containers = []
        for f, kind in enumerate(scan.kinds):
            last = int(np.searchsorted(scan.starts[:, f], end)) - 1
            if kind == "array_row":
                containers.append("array")
            elif last < 0:
                containers.append("list")  # an empty field: no closing opcode to read
            else:
                op = data.read_at(int(scan.ends[last, f]), 1)
                containers.append(_CLOSERS.get(op[0], "?") if op else "?")
    if "?" in containers or top not in ("list", "tuple", "dict"):
        raise NotSpanIndexableError(scan.path, "a container whose type split cannot tell")
    return ChunkShape(layout, top, scan.fields, tuple(containers), dtypes)


def _shape_from_object(obj: Any, layout: str, fields: tuple[str, ...]) -> ChunkShape:
    if LAYOUT_TABLE[layout].rows:
        return ChunkShape(layout, "list", fields, (), (None,) * len(fields))
    cols = list(obj.values()) if isinstance(obj, dict) else list(obj)
    containers = tuple(
        "array" if isinstance(c, np.ndarray) else "tuple" if isinstance(c, tuple) else "list"
        for c in cols
    )
    dtypes = tuple(c.dtype if isinstance(c, np.ndarray) else None for c in cols)
    top = "dict" if isinstance(obj, dict) else "tuple" if isinstance(obj, tuple) else "list"
    return ChunkShape(layout, top, fields, containers, dtypes)


def open_source(
    path: Path, policy: UnpicklePolicy, memory_bytes: int, scan: ScanResult | None
) -> tuple[SampleSource, ChunkShape, bool]:
    try:
        with open_bytes(path) as data:
            recorded = data.identity()  # before the scan: a change during it shows after
            if scan is None:
                scan = scan_file(data, encoding=policy.encoding)
                _refuse_metadata(path, scan.metadata)
            elif scan.size != recorded.size:
                raise ValueError(f"scan= is of a file of {scan.size} bytes, not of {path}")
    except NotSpanIndexableError as exc:
        need = WHOLE_FILE_FACTOR * recorded.size
        if need > memory_bytes:
            raise NotSpanIndexableError(
                path,
                f"{exc.reason}; loading it whole instead needs about {need:,} bytes "
                f"({WHOLE_FILE_FACTOR}x its size), over the memory budget of {memory_bytes:,} "
                f"(memory_bytes=, CLI --memory-bytes)",
                offset=exc.offset,
            ) from None
        columns, shape = _load_whole(path, policy)
        return LoadedSource(columns, _protocol_of(path), path, policy), shape, True
    src = SpanSource(scan, policy, recorded)
    try:
        return src, shape_from_scan(scan), False
    except BaseException:
        src.close()
        raise


def _one_per_pickle(objs: Sequence[Any], path: Path) -> bool:
    """Whether ``layout="auto"`` reads these pickles one sample each (a one-pickle sample,
    appended records: :mod:`pickleshard.scan.defaults`), as the scan of the file does."""
    try:
        layout = decode_records(objs, path).layout
    except UnsupportedLayoutError:
        return False  # the reading below says what is wrong, in its words
    return LAYOUT_TABLE[layout.removeprefix(APPENDED)].per_pickle


def _samples(objs: Sequence[Any], path: Path) -> tuple[Sequence[Any], ChunkShape]:
    """Appended pickles (or a file's one pickle) as one sample each."""
    first = objs[0]
    if type(first) is tuple and first:
        fields = default_field_names(len(first))
        shape = ChunkShape(SAMPLES.name, "", fields, (), (None,) * len(fields))
        try:
            return tuple(zip(*objs, strict=True)), shape
        except (TypeError, ValueError):
            raise UnsupportedLayoutError(
                path,
                f"appended pickles are not all samples of {len(first)} fields like the first",
            ) from None
    if type(first) is dict and first:
        keys = list(first)
        fields = tuple(str(k) for k in keys)
        shape = ChunkShape(DICT_SAMPLES.name, "", fields, (), (None,) * len(fields))
        try:
            return tuple([o[k] for o in objs] for k in keys), shape
        except (TypeError, KeyError, IndexError):
            raise UnsupportedLayoutError(
                path, "appended pickles are not all dicts with the keys of the first"
            ) from None
    return (objs,), ChunkShape(SAMPLES.name, "", ("x",), (), (None,), tuple_samples=False)


def _load_whole(path: Path, policy: UnpicklePolicy) -> tuple[Sequence[Any], ChunkShape]:
    """Every pickle of ``path``, as columns, by the scanner's rules for appended pickles."""
    # load_records classifies every failure, bytes after the last pickle included (they are
    # a NotAPickleError at their offset), and refuses impossible memo ids before unpickling.
    objs = load_records(path, policy, check_first=True)
    if _one_per_pickle(objs, path):
        return _samples(objs, path)
    if len(objs) == 1:
        decoded = decode_layout(objs[0], path, metadata=True)
        _refuse_metadata(path, decoded.metadata)
        return decoded.columns, _shape_from_object(objs[0], decoded.layout, decoded.fields)
    try:
        parts = [decode_layout(o, path) for o in objs]
    except UnsupportedLayoutError:
        return _samples(objs, path)
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


def _refuse_metadata(path: Path, metadata: dict[str, Any]) -> None:
    """Chunks hold columns only: a file's metadata (CIFAR's ``batch_label``) would be lost."""
    if metadata:
        raise UnsupportedLayoutError(
            path,
            f"split writes the columns only; the file's metadata {sorted(metadata)} would be lost",
        )


def _protocol_of(path: Path) -> int:
    with open_bytes(path) as data:
        head = data.read_at(0, 2)
    return head[1] if len(head) == 2 and head[0] == oc.PROTO_OP else 0
