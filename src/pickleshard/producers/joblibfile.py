"""``joblib.dump`` files: recognised by their bytes, arrays read by rows in place.

joblib pickles each numpy array as a ``joblib.numpy_pickle.NumpyArrayWrapper`` (its dtype,
shape, order) and, right after the wrapper's ``BUILD``, writes the array's raw bytes into the
stream (joblib >= 1.2 first writes one byte ``p`` and ``p`` padding bytes so the data starts
16-byte aligned; object arrays are a nested pickle instead). ``joblib.load`` swaps each wrapper
for the array read there. So the pickle is not a pickle ``pickle.load`` can read, but the
offset of every array's data is known:

- :func:`scan_joblib` walks the pickle part (the structure, a few hundred bytes), steps over
  each array's data and, for a top-level array, tuple/list of arrays or dict of arrays of equal
  first dimension in C order, returns a :class:`~pickleshard.scan.ScanResult` whose fields are
  ``array_row``: sample ``i`` is row ``i`` of each array, read in place.
- :func:`load_joblib` loads a joblib file whole (compressed ones, zlib/gzip/bz2/xz as
  ``compress=`` writes them, and structures the scan cannot read by rows) through joblib's own
  unpickler, with the allowlist as its ``find_class``.

Both use the allowlist for every global but the wrapper itself, which is never imported by the
scan (a stand-in records its state) and is joblib's own class in the whole load.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import math
import os
import pickle
import zlib
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from ..errors import (
    CorruptPickleError,
    FieldLengthMismatchError,
    MissingDependencyError,
    NotSpanIndexableError,
    PickleshardError,
    TruncatedPickleError,
)
from ..io import ByteSource, open_reader, open_source
from ..io.options import SourceOptions
from ..picklekit.memotables import SharedTable
from ..safety.policy import UnpicklePolicy
from ..scan.defaults import FieldFacts, one_pickle_is_one_sample
from ..scan.layouts import default_field_names
from ..scan.model import ArrayRow, ScanResult

__all__ = [
    "JoblibKind",
    "joblib_kind",
    "joblib_note",
    "load_joblib",
    "scan_joblib",
    "sniff_joblib",
]

WRAPPER = ("joblib.numpy_pickle", "NumpyArrayWrapper")
# The wrapper's global is written before the first array's data: in the first few hundred bytes
# of an ``(X, y)`` dump. Every file is sniffed before its scan (a remote one by a ranged read),
# so the first look is short; an error walking a file looks further (``joblib_note``).
SNIFF_BYTES = 1 << 12
SNIFF_DEEP = 1 << 16
_NAMES = (b"joblib.numpy_pickle", b"NumpyArrayWrapper")
JoblibKind = str  # "joblib" (uncompressed), "joblib-zlib", "joblib-gzip", ... or ""


def _names_joblib(head: bytes) -> bool:
    return all(n in head for n in _NAMES)


def _decompress_head(head: bytes) -> tuple[str, bytes]:
    """``(compressor, first decompressed bytes)`` of a stream joblib's ``compress=`` wrote."""
    try:
        if head[:1] == b"\x78" and len(head) > 1 and (head[0] << 8 | head[1]) % 31 == 0:
            return "zlib", zlib.decompressobj().decompress(head, 4096)
        if head[:2] == b"\x1f\x8b":
            return "gzip", gzip.GzipFile(fileobj=io.BytesIO(head)).read1(4096)
        if head[:3] == b"BZh":
            return "bz2", bz2.BZ2Decompressor().decompress(head, 4096)
        if head[:6] == b"\xfd7zXZ\x00" or head[:3] == b"]\x00\x00":
            return "lzma", lzma.LZMADecompressor().decompress(head, 4096)
    except (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError):
        pass
    return "", b""


def sniff_joblib(head: bytes) -> JoblibKind:
    """What the first bytes of a file say it is: ``"joblib"`` for an uncompressed
    ``joblib.dump`` file, ``"joblib-<compressor>"`` for a compressed one, ``""`` otherwise.
    Decided by the bytes (the wrapper's global, under any compression joblib writes), never by
    the file's name."""
    if head[:1] == b"\x80" or head[:1] in (b"c", b"("):
        return "joblib" if _names_joblib(head) else ""
    kind, inner = _decompress_head(head)
    return f"joblib-{kind}" if kind and _names_joblib(inner) else ""


def joblib_kind(source: ByteSource, deep: bool = False) -> JoblibKind:
    """:func:`sniff_joblib` of an open source's first :data:`SNIFF_BYTES` (``deep``:
    :data:`SNIFF_DEEP`) bytes."""
    return sniff_joblib(source.read_at(0, min(SNIFF_DEEP if deep else SNIFF_BYTES, source.size)))


def joblib_note(exc: CorruptPickleError, source: ByteSource) -> CorruptPickleError:
    """``exc`` (a pickle walk's error on ``source``), or, when the file is a ``joblib.dump``
    file, the error that says so (its arrays are raw bytes, not opcodes)."""
    kind = joblib_kind(source, deep=True)
    if not kind:
        return exc
    return type(exc)(
        source.name,
        f"a joblib.dump file ({kind}): each array's raw bytes follow its wrapper in the stream, "
        "so it is not a plain pickle; PickleDataset reads it (arrays by rows in place when "
        "uncompressed; see docs/producers.md), joblib.load loads it",
        offset=exc.offset,
    )


class _Wrapper:
    """Stands in for ``NumpyArrayWrapper`` in the scan: keeps the state ``BUILD`` gives it."""

    state: dict[str, Any]

    def __setstate__(self, state: Any) -> None:
        self.state = state if isinstance(state, dict) else {}


class _ArrayRef:
    """Where a joblib array's data sits: ``start`` in the file, ``dtype``, ``shape``, ``order``."""

    def __init__(self, start: int, dtype: np.dtype[Any], shape: tuple[int, ...], order: str):
        self.start, self.dtype, self.shape, self.order = start, dtype, shape, order

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)


Lookup = Callable[[str, str], Any]


class _Structure(pickle._Unpickler):
    """Unpickles a joblib file's pickle part, each array's data stepped over (an
    :class:`_ArrayRef` in its place). Globals other than the wrapper go through ``lookup``."""

    dispatch = pickle._Unpickler.dispatch.copy()

    def __init__(self, fh: IO[bytes], path: str, size: int, lookup: Lookup, encoding: str):
        super().__init__(fh, encoding=encoding)
        self._fh, self._path, self._size, self._lookup = fh, path, size, lookup
        self._encoding = encoding
        self.refs: list[_ArrayRef] = []
        self.nested = 0  # object arrays (a nested pickle, loaded: nothing to read in place)

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == WRAPPER:
            return _Wrapper
        return self._lookup(module, name)

    def load_build(self) -> None:
        pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]
        top = self.stack[-1]  # type: ignore[attr-defined]
        if type(top) is _Wrapper:
            self.stack[-1] = self._array(top.state)  # type: ignore[attr-defined]

    dispatch[pickle.BUILD[0]] = load_build  # type: ignore[assignment]

    def _array(self, state: dict[str, Any]) -> Any:
        dtype = state.get("dtype")
        if not isinstance(dtype, np.dtype):
            raise NotSpanIndexableError(self._path, "a joblib array wrapper without a dtype")
        if dtype.hasobject:  # a nested pickle, read as joblib does (same lookup)
            self.nested += 1
            inner = _Structure(self._fh, self._path, self._size, self._lookup, self._encoding)
            return inner.load()
        shape = tuple(int(n) for n in state.get("shape", ()))
        fh = self._fh
        pos = fh.tell()
        if state.get("numpy_array_alignment_bytes") is not None:
            pad = fh.read(1)
            if not pad:
                raise TruncatedPickleError(self._path, "file ends before array data", offset=pos)
            pos += 1 + pad[0]
        ref = _ArrayRef(pos, dtype, shape, str(state.get("order", "C")))
        if pos + ref.nbytes > self._size:
            raise TruncatedPickleError(
                self._path,
                f"joblib array of {ref.nbytes} bytes at byte {pos} runs past the end "
                f"({self._size} bytes)",
                offset=pos,
            )
        fh.seek(pos + ref.nbytes)
        self.refs.append(ref)
        return ref


def _lookup_for(policy: UnpicklePolicy, path: str) -> Lookup:
    allow = policy.find_class(path)
    if allow is not None:
        return allow
    plain: Lookup = pickle.Unpickler(io.BytesIO(b"")).find_class  # trusted: as pickle does
    return plain


def _columns(top: Any, path: str) -> tuple[str, tuple[str, ...], list[_ArrayRef]]:
    """``(layout, fields, arrays)`` when ``top`` is rows of arrays read in place, else
    :class:`NotSpanIndexableError` saying why."""
    if isinstance(top, _ArrayRef):
        return "columns", ("x",), [top]
    values = list(top.values()) if type(top) is dict else top
    if type(top) in (tuple, dict) and all(isinstance(v, _ArrayRef) and v.shape for v in values):
        facts = [FieldFacts("array", v.shape[0], len(v.shape)) for v in values]
        if one_pickle_is_one_sample(facts, type(top) is dict):  # as the whole load reads it
            raise NotSpanIndexableError(
                path, "joblib arrays that are one sample (pickleshard.scan.defaults): read whole"
            )
    if type(top) in (tuple, list) and top and all(isinstance(v, _ArrayRef) for v in top):
        return "columns", default_field_names(len(top)), list(top)
    if (
        type(top) is dict
        and top
        and all(type(k) is str for k in top)
        and all(isinstance(v, _ArrayRef) for v in top.values())
    ):
        return "dict_columns", tuple(top), list(top.values())
    raise NotSpanIndexableError(
        path,
        f"joblib file whose top-level object is {type(top).__name__}, not arrays, a tuple or "
        "list of arrays or a dict of arrays: read whole through joblib",
    )


def scan_joblib(
    path: str | os.PathLike[str] | ByteSource, policy: UnpicklePolicy
) -> ScanResult | None:
    """The scan of an uncompressed ``joblib.dump`` file: every field an ``array_row`` read in
    place (see the module docstring); None when the file is not one (its bytes say so).
    Raises :class:`NotSpanIndexableError` for a joblib file to load whole (compressed, object
    or Fortran-order arrays, another structure), and the allowlist's refusal. ``path`` is a
    path (opened and closed here) or an open source (left open)."""
    if isinstance(path, ByteSource):
        return _scan_joblib(path, policy)
    with open_source(os.fspath(path)) as source:
        return _scan_joblib(source, policy)


def _scan_joblib(source: ByteSource, policy: UnpicklePolicy) -> ScanResult | None:
    where = source.name
    kind = joblib_kind(source)
    if not kind:
        return None
    if kind != "joblib":
        raise NotSpanIndexableError(where, f"a compressed joblib file ({kind}): read whole")
    with open_reader(source) as raw:
        fh = io.BufferedReader(raw, 1 << 16)
        walker = _Structure(fh, where, source.size, _lookup_for(policy, where), policy.encoding)
        try:
            top = walker.load()
        except PickleshardError:
            raise
        except Exception as exc:  # the whole load says what is wrong, in its words
            raise NotSpanIndexableError(
                where, f"joblib structure not read in place: {type(exc).__name__}: {exc}"
            ) from None
        end = fh.tell()
    protocol = source.read_at(1, 1)[0] if source.read_at(0, 1) == b"\x80" else 0
    layout, fields, refs = _columns(top, where)
    return _result(where, source.size, end, protocol, layout, fields, refs, walker)


def _result(
    where: str,
    size: int,
    end: int,
    protocol: int,
    layout: str,
    fields: tuple[str, ...],
    refs: list[_ArrayRef],
    walker: _Structure,
) -> ScanResult:
    if walker.nested or protocol < 2:
        raise NotSpanIndexableError(where, "joblib file with object arrays or protocol < 2")
    if any(r.order != "C" and len(r.shape) > 1 for r in refs) or any(not r.shape for r in refs):
        raise NotSpanIndexableError(where, "joblib arrays in Fortran order or 0-d: read whole")
    n = refs[0].shape[0]
    if any(r.shape[0] != n for r in refs):
        detail = ", ".join(f"len({f}) = {r.shape[0]}" for f, r in zip(fields, refs, strict=True))
        raise FieldLengthMismatchError(where, f"fields have different lengths: {detail}")
    rows = [r.nbytes // n if n else 0 for r in refs]
    starts = np.stack(
        [r.start + np.arange(n, dtype=np.int64) * b for r, b in zip(refs, rows, strict=True)], 1
    ).reshape(n, len(refs))
    ends = starts + np.asarray(rows, np.int64)
    arrays = tuple(
        ArrayRow(r.dtype.newbyteorder("="), r.shape[1:], not r.dtype.isnative) for r in refs
    )
    return ScanResult(
        path=where,
        size=size,
        protocol=protocol,
        layout=layout,
        fields=fields,
        kinds=("array_row",) * len(refs),
        arrays=arrays,
        starts=starts,
        ends=ends,
        memo_base=np.full((n, len(refs)), -1, np.int64),
        ext_offsets=np.zeros(n * len(refs) + 1, np.int64),
        ext_keys=np.zeros(0, np.int64),
        records=np.array([[0, end, 0]], np.int64),
        shared=SharedTable(),
        bytes_read=max(0, end - sum(r.nbytes for r in refs)),
        engine="joblib",
    )


def load_joblib(
    path: str | os.PathLike[str], policy: UnpicklePolicy, options: SourceOptions | None = None
) -> Any:
    """Load a joblib file whole (any compression ``joblib.dump`` writes, opened with
    ``options``) through joblib's unpickler, its globals through the allowlist (the array
    wrapper is joblib's own); :class:`MissingDependencyError` when joblib is not installed."""
    where = os.fspath(path)
    try:
        from joblib import numpy_pickle, numpy_pickle_utils
    except ImportError:
        raise MissingDependencyError(
            "joblib", "joblib", f"{where} is a joblib.dump file; loading it"
        ) from None
    lookup = policy.find_class(where)

    class Restricted(numpy_pickle.NumpyUnpickler):  # type: ignore[misc]
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) == WRAPPER or lookup is None:
                return super().find_class(module, name)
            return lookup(module, name)

    with open_source(where, options) as source, open_reader(source) as raw:
        fh = io.BufferedReader(raw, 1 << 16)
        with numpy_pickle_utils._validate_fileobject_and_memmap(fh, where) as (fobj, _):
            if isinstance(fobj, str):  # joblib < 0.10's format: arrays in side files
                raise NotSpanIndexableError(where, "a joblib < 0.10 file (arrays in side files)")
            return Restricted(where, fobj, ensure_native_byte_order=True).load()
