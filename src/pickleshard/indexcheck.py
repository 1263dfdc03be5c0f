"""Validation of an index read from disk: it is untrusted input, like the data it describes.

An index shipped with a downloaded dataset can be edited as easily as the pickles. Every read
path trusts what :class:`~pickleshard.index.DatasetIndex` hands it (offsets it ``pread``\\ s,
dtypes and shapes it allocates, memo ids it renumbers, rows it slices), so everything is checked
here once, when the index is opened, and a violation raises
:class:`~pickleshard.errors.IndexFormatError` naming the index file and what is wrong:

- ``index.json``: types and ranges of every header, files-table and skipped-files entry; file
  paths relative and inside the dataset directory, each named once; array file names plain
  names inside the index directory; the rows each span file takes in the span arrays exactly
  where the builder puts them; counts that add up (files, samples, modes).
- each ``.npy`` (:func:`load_array`): a regular file, opened once and mapped read-only without
  ever unpickling (its header is parsed here, not by ``np.load``); a plain int64 array (the
  ``samples`` one: its structured dtype) of the expected shape, C order, exactly the file's size;
  its CRC-32 equal to the one the header recorded at build time (accidental corruption: an
  unkeyed checksum cannot stop a forger, the checks below do).
- contents (:func:`check_arrays`, vectorised over all rows at once): ``samples`` numbers each
  file's samples 0..n-1 in files-table order; every span lies inside its file and inside one
  pickle of it (``records``), spans of a field are in file order and do not overlap (swapped or
  moved rows are caught); memo bases are within ``[0, start]`` and grow no faster than the
  offsets; CSR offsets grow and cover ``ext_keys``; every external is an earlier memo key of the
  file's shared table; array rows, small ints and per-sample arrays
  (:class:`~pickleshard.scan.ArrayItem`: a dtype without objects, whose shape fills the payload
  the spans leave room for) agree with the span lengths.

After these checks no read allocates more than the span it reads, ``pread``\\ s outside the
file, builds an array of Python-object dtype from raw bytes, or indexes outside an array.
What only the data can tell (a span's bytes edited together with the index) is the read path's
business (:mod:`pickleshard.spanread` checks each payload's framing).
"""

from __future__ import annotations

import math
import os
import pickle
import re
import stat
import zlib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from . import opcodes as oc
from .errors import IndexFormatError
from .indexfiles import SPAN_ARRAYS, FileEntry
from .scan import _MAX_TEMPLATE, ArrayItem, ArrayRow, _item_from_json

__all__ = [
    "ARRAY_NAME",
    "SAMPLES_DTYPE",
    "IndexProblem",
    "array_checksum",
    "check_arrays",
    "check_header",
    "expected_shapes",
    "file_checksum",
    "load_array",
]

SAMPLES_DTYPE = np.dtype([("file", "<u4"), ("item", "<u4")])
_I8 = np.dtype(np.int64)
# a file of the index directory: a plain name, never a path (``pickleshard index`` deletes the
# arrays an old header names, so a name must never reach outside that directory)
ARRAY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\.npy")
_MAX_ID = 1 << 62  # any count or offset of a real index is far below this
_FRAME = 9  # bytes of a FRAME header a span may end with
_INT_LENGTHS = np.array(
    sorted({n + k for n in oc.INT_SPAN.values() for k in (0, _FRAME)}), dtype=np.int64
)
_PICKLE, _ROW, _INT, _ITEM = range(4)  # how a (file, field) is read, as the readers decide


class IndexProblem(Exception):
    """One violation: ``where`` names the index file, ``what`` says what is wrong."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(what)
        self.where, self.what = where, what

    def error(self, index_dir: Path) -> IndexFormatError:
        """The :class:`IndexFormatError` to raise for the index in ``index_dir``."""
        return IndexFormatError(
            index_dir / self.where,
            f"{self.what} (a damaged or edited index: rebuild it with `pickleshard index` or "
            "rebuild='auto')",
        )


# -- index.json ----------------------------------------------------------------------------------


def _int(v: Any, what: str, lo: int = 0, hi: int = _MAX_ID, *, none: bool = False) -> Any:
    if v is None and none:
        return None
    if type(v) is not int or not lo <= v <= hi:
        raise IndexProblem(
            "index.json", f"{what} is {_show(v)}, expected an integer in [{lo}, {hi}]"
        )
    return v


def _str(v: Any, what: str, *, none: bool = False) -> Any:
    if (v is None and none) or type(v) is str:
        return v
    raise IndexProblem("index.json", f"{what} is {_show(v)}, expected a string")


def _list(v: Any, what: str, n: int | None = None) -> list[Any]:
    if type(v) is not list or (n is not None and len(v) != n):
        want = "a list" if n is None else f"a list of {n}"
        raise IndexProblem("index.json", f"{what} is {_show(v)}, expected {want}")
    return v


def _dict(v: Any, what: str) -> dict[str, Any]:
    if type(v) is not dict:
        raise IndexProblem("index.json", f"{what} is {_show(v)}, expected an object")
    return v


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _rel_path(v: Any, what: str) -> str:
    """A dataset file's path: relative, normalised, inside the dataset directory."""
    _str(v, what)
    parts = PurePosixPath(v).parts
    if (
        not v
        or "\0" in v
        or "\\" in v
        or v.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
        or "/".join(parts) != v
    ):
        raise IndexProblem(
            "index.json", f"{what} {v!r} is not a plain relative path inside the dataset"
        )
    return str(v)


_FILE_KEYS = set(FileEntry.__dataclass_fields__)
_SKIP_KEYS = {"path", "error", "message", "size", "mtime_ns", "ctime_ns", "ino"}


def _file_entry(obj: Any, k: int, fields: list[str]) -> FileEntry:
    at = f"files[{k}]"
    row = _dict(obj, at)
    extra, missing = set(row) - _FILE_KEYS, {"path", "size", "mode"} - set(row)
    if extra or missing:
        raise IndexProblem("index.json", f"{at} has keys {sorted(extra)} / lacks {sorted(missing)}")
    _rel_path(row["path"], f"{at}.path")
    for key in ("size", "num_samples", "decoded_nbytes"):
        _int(row.get(key), f"{at}.{key}", hi=(1 << 32) - 1 if key == "num_samples" else _MAX_ID)
    _int(row.get("mtime_ns"), f"{at}.mtime_ns", lo=-_MAX_ID)
    _int(row.get("ctime_ns"), f"{at}.ctime_ns", lo=-_MAX_ID, none=True)
    _int(row.get("ino"), f"{at}.ino", none=True)
    for key in ("fingerprint", "layout"):
        _str(row.get(key), f"{at}.{key}")
    _str(row.get("reason"), f"{at}.reason", none=True)
    if row.get("fields") != fields:
        raise IndexProblem("index.json", f"{at}.fields is {_show(row.get('fields'))}, not {fields}")
    mode = row["mode"]
    if mode not in ("span", "whole"):
        raise IndexProblem("index.json", f"{at}.mode is {_show(mode)}, expected 'span' or 'whole'")
    for key in ("span_row", "ext_row", "record_row"):
        _int(row.get(key, -1), f"{at}.{key}", lo=-1)
    if mode == "whole" and (row.get("scan") is not None or row.get("span_row", -1) != -1):
        raise IndexProblem("index.json", f"{at} is read whole but names span rows")
    if mode == "span":
        _scan_meta(row.get("scan"), f"{at}.scan", row["size"], len(fields), row["num_samples"])
    return FileEntry.from_json(row)


def _dtype(descr: Any, what: str) -> np.dtype[Any]:
    try:
        dtype = np.lib.format.descr_to_dtype(_tuples_checked(descr, what))
    except IndexProblem:
        raise
    except Exception as exc:  # whatever numpy makes of a bad descr
        raise IndexProblem("index.json", f"{what} {_show(descr)} is not a dtype: {exc}") from None
    if dtype.hasobject:
        raise IndexProblem(
            "index.json", f"{what} {_show(descr)} holds Python objects: never read raw"
        )
    return dtype


def _tuples_checked(descr: Any, what: str, depth: int = 0) -> Any:
    """:func:`pickleshard.scan._tuples` over a descr of bounded depth and plain parts."""
    if type(descr) is str:
        return descr
    if depth > 8 or type(descr) is not list:
        raise IndexProblem("index.json", f"{what} is not a dtype descr")
    out = []
    for entry in descr:
        if type(entry) is not list or not 2 <= len(entry) <= 3:
            raise IndexProblem("index.json", f"{what} has a field entry {_show(entry)}")
        name = entry[0]
        if type(name) is list:
            if len(name) != 2 or not all(type(x) is str for x in name):
                raise IndexProblem("index.json", f"{what} has a field name {_show(name)}")
            name = tuple(name)
        elif type(name) is not str:
            raise IndexProblem("index.json", f"{what} has a field name {_show(name)}")
        rest = [_tuples_checked(entry[1], what, depth + 1)]
        if len(entry) == 3:
            rest.append(tuple(_shape(entry[2], f"{what} subarray shape")))
        out.append((name, *rest))
    return out


def _shape(v: Any, what: str) -> tuple[int, ...]:
    dims = _list(v, what)
    if len(dims) > 32:
        raise IndexProblem("index.json", f"{what} has {len(dims)} dimensions")
    return tuple(_int(d, f"{what}[{j}]") for j, d in enumerate(dims))


def _scan_meta(meta: Any, at: str, size: int, nf: int, n: int) -> None:
    m = _dict(meta, at)
    if m.get("format") != 1:
        raise IndexProblem("index.json", f"{at}.format is {_show(m.get('format'))}, expected 1")
    if m.get("size") != size:
        raise IndexProblem(
            "index.json", f"{at}.size is {_show(m.get('size'))}, the file's is {size}"
        )
    _int(m.get("protocol"), f"{at}.protocol", lo=2, hi=pickle.HIGHEST_PROTOCOL)
    _int(m.get("bytes_read"), f"{at}.bytes_read")
    _int(m.get("num_records"), f"{at}.num_records")
    _str(m.get("layout"), f"{at}.layout")
    if _list(m.get("fields"), f"{at}.fields", nf) and not all(type(f) is str for f in m["fields"]):
        raise IndexProblem("index.json", f"{at}.fields are not strings")
    kinds = _list(m.get("kinds"), f"{at}.kinds", nf)
    arrays = _list(m.get("arrays"), f"{at}.arrays", nf)
    items = m.get("items", [])
    if items:
        _list(items, f"{at}.items", nf)
    for f, kind in enumerate(kinds):
        if kind not in ("pickle", "array_row"):
            raise IndexProblem("index.json", f"{at}.kinds[{f}] is {_show(kind)}")
        row, item = arrays[f], items[f] if items else None
        if (row is not None) != (kind == "array_row") or (kind == "array_row" and item):
            raise IndexProblem(
                "index.json", f"{at}: field {f} is {kind} but has arrays/items entries"
            )
        if row is not None:
            r = _dict(row, f"{at}.arrays[{f}]")
            _dtype(r.get("descr"), f"{at}.arrays[{f}].descr")
            _shape(r.get("row_shape"), f"{at}.arrays[{f}].row_shape")
            if type(r.get("swap")) is not bool:
                raise IndexProblem("index.json", f"{at}.arrays[{f}].swap is not a boolean")
        if item is not None:
            _item(_dict(item, f"{at}.items[{f}]"), f"{at}.items[{f}]", n)
    _shared(_dict(m.get("shared"), f"{at}.shared"), f"{at}.shared", size)


def _item(it: dict[str, Any], at: str, n: int) -> None:
    if it.get("kind") == "int":
        if set(it) != {"kind"}:
            raise IndexProblem("index.json", f"{at} is an int item with other keys")
        return
    _dtype(it.get("descr"), f"{at}.descr")
    _shape(it.get("shape"), f"{at}.shape")
    for key in ("swap", "readonly"):
        if type(it.get(key)) is not bool:
            raise IndexProblem(
                "index.json", f"{at}.{key} is {_show(it.get(key))}, expected a boolean"
            )
    _int(it.get("prefix"), f"{at}.prefix", lo=1, hi=_MAX_TEMPLATE)
    exc = _list(it.get("exceptions"), f"{at}.exceptions")
    if not all(type(e) is int for e in exc) or any(
        not 0 <= a < b for a, b in zip(exc, [*exc[1:], n], strict=False)
    ):
        raise IndexProblem("index.json", f"{at}.exceptions are not sorted sample numbers below {n}")
    if n and len(exc) >= n:
        raise IndexProblem("index.json", f"{at}: every sample is an exception")


def _shared(sh: dict[str, Any], at: str, size: int) -> None:
    keys = _list(sh.get("keys"), f"{at}.keys")
    owner = _list(sh.get("element_of"), f"{at}.element_of", len(keys))
    elements = _list(sh.get("elements"), f"{at}.elements")
    bounds: list[tuple[int, int]] = []
    for j, el in enumerate(elements):
        s, e, b, x = _list(el, f"{at}.elements[{j}]", 4)
        _int(s, f"{at}.elements[{j}] start", hi=size)
        _int(e, f"{at}.elements[{j}] end", lo=s + 1, hi=size)
        _int(b, f"{at}.elements[{j}] memo base", hi=s)
        ext = _list(x, f"{at}.elements[{j}] externals")
        # an element's externals are keys defined before it: replays always go backwards
        if not all(type(k) is int for k in ext) or any(
            not 0 <= p < q for p, q in zip(ext, [*ext[1:], b], strict=False)
        ):
            raise IndexProblem(
                "index.json", f"{at}.elements[{j}] externals are not sorted keys below {b}"
            )
        bounds.append((b, b + (e - s)))
    last = -1
    for k, (key, j) in enumerate(zip(keys, owner, strict=True)):
        if type(key) is not int or type(j) is not int or not last < key or not 0 <= j < len(bounds):
            raise IndexProblem("index.json", f"{at}: key {k} is {_show(key)} of element {_show(j)}")
        if not bounds[j][0] <= key < bounds[j][1]:
            raise IndexProblem("index.json", f"{at}: key {key} is not defined in element {j}")
        last = key
    for j, el in enumerate(elements):
        if not set(el[3]) <= set(keys):
            raise IndexProblem(
                "index.json", f"{at}.elements[{j}] needs keys the table does not define"
            )


def check_header(header: dict[str, Any]) -> tuple[list[FileEntry], list[dict[str, Any]]]:
    """The files table and skipped files of a header of the current version, checked; raises
    ``IndexProblem``. The array names and checksums are checked too (not the arrays themselves)."""
    fields = _list(header.get("fields"), "fields")
    if not all(type(f) is str for f in fields) or len(set(fields)) != len(fields):
        raise IndexProblem("index.json", f"fields {_show(fields)} are not distinct strings")
    files_json = _list(header.get("files"), "files")
    files: list[FileEntry] = []
    for k, obj in enumerate(files_json):
        files.append(_file_entry(obj, k, fields))
    skipped = _list(header.get("skipped", []), "skipped")
    for k, s in enumerate(skipped):
        at = f"skipped[{k}]"
        if set(_dict(s, at)) != _SKIP_KEYS and set(s) != _SKIP_KEYS - {"ctime_ns", "ino"}:
            raise IndexProblem("index.json", f"{at} has keys {sorted(s)}")
        _rel_path(s["path"], f"{at}.path")
        _str(s["error"], f"{at}.error")
        _str(s["message"], f"{at}.message")
        for key in ("size", "mtime_ns", "ctime_ns", "ino"):
            _int(s.get(key), f"{at}.{key}", lo=-_MAX_ID, none=True)
    paths = [f.path for f in files] + [s["path"] for s in skipped]
    if len(set(paths)) != len(paths):
        raise IndexProblem("index.json", "a file is listed twice")
    n = sum(f.num_samples for f in files)
    if header.get("num_samples") != n or header.get("num_files") != len(files):
        raise IndexProblem(
            "index.json",
            f"num_samples {_show(header.get('num_samples'))} / num_files "
            f"{_show(header.get('num_files'))} disagree with the files table ({n} / {len(files)})",
        )
    modes = {m: sum(f.mode == m for f in files) for m in ("span", "whole")}
    if header.get("modes") != modes:
        raise IndexProblem(
            "index.json", f"modes {_show(header.get('modes'))}, the files table has {modes}"
        )
    layout = _list(header.get("layout"), "layout")
    if not all(type(x) is str for x in layout):
        raise IndexProblem("index.json", "layout is not a list of strings")
    _check_placement(files, len(fields))
    names = _dict(header.get("arrays"), "arrays")
    sums = _dict(header.get("checksums"), "checksums")
    wanted = {"samples", *SPAN_ARRAYS}
    if set(names) != wanted or set(sums) != wanted:
        raise IndexProblem(
            "index.json", f"arrays/checksums name {sorted(names)}, expected {sorted(wanted)}"
        )
    for key, name in names.items():
        if type(name) is not str or not ARRAY_NAME.fullmatch(name):
            raise IndexProblem(
                "index.json", f"arrays.{key} {_show(name)} is not a file of the index"
            )
        if type(sums[key]) is not str or not re.fullmatch(r"crc32:[0-9a-f]{8}", sums[key]):
            raise IndexProblem("index.json", f"checksums.{key} is {_show(sums[key])}")
    if len(set(names.values())) != len(names):
        raise IndexProblem("index.json", "two arrays share a file")
    return files, skipped


def _check_placement(files: list[FileEntry], nf: int) -> None:
    """Each span file's first rows are where the builder puts them: right after the previous
    span file's (so rows can be neither shared nor moved between files)."""
    row = ext = rec = 0
    for k, e in enumerate(files):
        if e.mode != "span":
            continue
        assert e.scan is not None
        if (e.span_row, e.ext_row, e.record_row) != (row, ext, rec):
            raise IndexProblem(
                "index.json",
                f"files[{k}] ({e.path}) starts at span/ext/record rows "
                f"{(e.span_row, e.ext_row, e.record_row)}, expected {(row, ext, rec)}",
            )
        row, ext, rec = (
            row + e.num_samples,
            ext + e.num_samples * nf + 1,
            rec + e.scan["num_records"],
        )


# -- the .npy files ------------------------------------------------------------------------------


def array_checksum(data: Iterable[Any]) -> str:
    """The checksum stored in the header for an array file whose bytes are ``data`` (chunks)."""
    crc = 0
    for chunk in data:
        crc = zlib.crc32(chunk, crc)
    return f"crc32:{crc:08x}"


def file_checksum(path: Path) -> str:
    """:func:`array_checksum` of the file at ``path``, read 4 MiB at a time."""
    with open(path, "rb") as fh:
        return array_checksum(iter(lambda: fh.read(1 << 22), b""))


def load_array(
    index_dir: Path, name: str, dtype: np.dtype[Any], shape: tuple[int, ...], checksum: str
) -> np.ndarray:
    """Map index file ``name`` read-only and return its array, after checking that it is a
    regular ``.npy`` of exactly ``dtype`` and ``shape`` (C order, no bytes after the data) whose
    bytes have ``checksum``. Never unpickles (``np.load`` is not called)."""
    path = index_dir / name
    try:
        # O_NONBLOCK: a FIFO planted under the array's name must not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise IndexProblem(name, f"cannot open: {exc.strerror or exc}") from None
    with open(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IndexProblem(name, "is not a regular file")
        try:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                got_shape, fortran, got = np.lib.format.read_array_header_1_0(fh)
            else:
                got_shape, fortran, got = np.lib.format.read_array_header_2_0(fh)
        except Exception as exc:  # numpy's own header parser (a literal_eval, bounded)
            raise IndexProblem(name, f"is not a .npy file: {exc}") from None
        header_len = fh.tell()
        any_length = shape == (-1,) and len(got_shape) == 1
        if got.hasobject or got != dtype or fortran or not (got_shape == shape or any_length):
            raise IndexProblem(
                name,
                f"holds {got} {'Fortran-order ' if fortran else ''}shape {got_shape}, expected "
                f"{dtype} shape {shape}",
            )
        shape = got_shape
        nbytes = math.prod(shape) * dtype.itemsize
        if st.st_size != header_len + nbytes:
            raise IndexProblem(
                name,
                f"is {st.st_size} bytes, expected {header_len + nbytes} for its header and data "
                "(truncated or extended)",
            )
        fh.seek(0)
        head = fh.read(header_len)
        array = np.memmap(fh, dtype=dtype, mode="r", offset=header_len, shape=shape)
    data = np.asarray(array).reshape(-1).view(np.uint8) if nbytes else b""
    got_sum = array_checksum((head, data))
    if got_sum != checksum:
        raise IndexProblem(name, f"checksum {got_sum}, the header recorded {checksum}: corrupted")
    return array


def expected_shapes(files: list[FileEntry], nf: int) -> dict[str, tuple[int, ...]]:
    """The shape of every array of an index with this (checked) files table."""
    span = [f for f in files if f.mode == "span"]
    rows = sum(f.num_samples for f in span)
    return {
        "samples": (sum(f.num_samples for f in files),),
        "starts": (rows, nf),
        "ends": (rows, nf),
        "memo_base": (rows, nf),
        "ext_offsets": (rows * nf + len(span),),
        "ext_keys": (-1,),  # any length: the offsets say which
        "records": (sum(int(f.scan["num_records"]) for f in span if f.scan), 3),
    }


# -- the arrays' contents ------------------------------------------------------------------------


def check_arrays(
    files: list[FileEntry], nf: int, arrays: dict[str, np.ndarray], names: dict[str, str]
) -> None:
    """Check the contents of the arrays against the (checked) files table; raises ``IndexProblem``."""
    _check_samples(files, np.asarray(arrays["samples"]), names["samples"])
    span = [f for f in files if f.mode == "span"]
    if not span:
        return
    a = {k: np.asarray(arrays[k]) for k in SPAN_ARRAYS}
    counts = np.array([f.num_samples for f in span], np.int64)
    sizes = np.array([f.size for f in span], np.int64)
    nrec = np.array([int(f.scan["num_records"]) for f in span if f.scan], np.int64)
    row_file = np.repeat(np.arange(len(span)), counts)
    first_row = np.concatenate([[0], np.cumsum(counts)])
    how = _hows(span, nf)  # (S, F) how each file's field is read
    _check_records(span, a["records"], nrec, sizes, names["records"])
    _check_spans(span, a, how, row_file, first_row, sizes, nrec, names)
    _check_externals(span, a, how, row_file, sizes, names)
    _check_items(span, a, how, row_file, first_row, names)


def _check_samples(files: list[FileEntry], samples: np.ndarray, name: str) -> None:
    """``samples`` numbers each file's samples 0..n-1, file after file."""
    counts = np.array([f.num_samples for f in files], np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    file = samples["file"].astype(np.int64)
    if len(file) and int(file.max()) >= len(files):
        raise IndexProblem(name, f"names file {int(file.max())}, the files table has {len(files)}")
    rows = np.arange(len(file), dtype=np.int64)
    lo = starts[file]
    bad = (rows < lo) | (rows >= starts[file + 1]) | (samples["item"] != rows - lo)
    if bad.any():
        r = int(np.argmax(bad))
        raise IndexProblem(
            name,
            f"row {r} is ({int(file[r])}, {int(samples['item'][r])}), not the file's next sample",
        )


def _hows(span: list[FileEntry], nf: int) -> np.ndarray:
    how = np.full((len(span), nf), _PICKLE, np.int8)
    for s, e in enumerate(span):
        assert e.scan is not None
        items = e.scan.get("items") or [None] * nf
        for f in range(nf):
            if e.scan["kinds"][f] == "array_row":
                how[s, f] = _ROW
            elif items[f] is not None:
                how[s, f] = _INT if items[f].get("kind") == "int" else _ITEM
    return how


def _first_bad(bad: np.ndarray) -> tuple[int, ...]:
    return tuple(int(x) for x in np.unravel_index(int(np.argmax(bad)), bad.shape))


def _check_records(
    span: list[FileEntry], rec: np.ndarray, nrec: np.ndarray, sizes: np.ndarray, name: str
) -> None:
    """Each file's pickles: inside the file, in order, not overlapping; shifts in range."""
    rec_file = np.repeat(np.arange(len(span)), nrec)
    size = sizes[rec_file]
    start, end, shift = rec[:, 0], rec[:, 1], rec[:, 2]
    bad = (start < 0) | (end <= start) | (end > size) | (shift < -size) | (shift > start)
    same = rec_file[1:] == rec_file[:-1]
    bad[1:] |= same & (start[1:] < end[:-1])
    if bad.any():
        q = int(np.argmax(bad))
        e = span[int(rec_file[q])]
        raise IndexProblem(
            name,
            f"row {q} ({e.path}): pickle {[int(v) for v in rec[q]]} is not in "
            f"order inside the file's {e.size} bytes",
        )
    empty = (nrec == 0) & (np.array([f.num_samples for f in span]) > 0)
    if empty.any():
        raise IndexProblem(name, f"{span[int(np.argmax(empty))].path} has samples but no pickles")


def _check_spans(
    span: list[FileEntry],
    a: dict[str, np.ndarray],
    how: np.ndarray,
    row_file: np.ndarray,
    first_row: np.ndarray,
    sizes: np.ndarray,
    nrec: np.ndarray,
    names: dict[str, str],
) -> None:
    """Every span inside its file and one of its pickles, in file order per field; memo bases
    in ``[0, start]``, growing no faster than the offsets."""
    st, en, mb = a["starts"], a["ends"], a["memo_base"]
    if not len(st):
        return
    h = how[row_file]  # (R, F)
    pickled = h != _ROW
    size = sizes[row_file][:, None]
    bad = (st < 0) | (en > size) | (en < st) | (pickled & (en == st))
    if bad.any():
        r, f = _first_bad(bad)
        raise _span_bad(
            names["starts"], span, row_file, first_row, r, f, st, en, "is not inside the file"
        )
    same = (row_file[1:] == row_file[:-1])[:, None]
    bad = np.zeros(st.shape, bool)
    bad[1:] = same & (st[1:] < en[:-1])
    if bad.any():
        r, f = _first_bad(bad)
        raise _span_bad(
            names["starts"],
            span,
            row_file,
            first_row,
            r,
            f,
            st,
            en,
            "starts before the previous sample's ends (rows out of order)",
        )
    bad = np.where(pickled, (mb < 0) | (mb > st), mb != -1)
    step = np.zeros(st.shape, bool)
    d_mb, d_st = mb[1:] - mb[:-1], st[1:] - st[:-1]
    step[1:] = same & pickled[1:] & ((d_mb < 0) | (d_mb > d_st))
    bad |= step
    if bad.any():
        r, f = _first_bad(bad)
        raise _span_bad(
            names["memo_base"],
            span,
            row_file,
            first_row,
            r,
            f,
            st,
            en,
            f"has memo base {int(mb[r, f])}, out of range",
        )
    # inside one pickle: offsets made global by adding the sizes of the files before
    bias = np.concatenate([[0], np.cumsum(sizes + 1)])[:-1]
    rec = a["records"]
    rec_file = np.repeat(np.arange(len(span)), nrec)
    g_start, g_end = rec[:, 0] + bias[rec_file], rec[:, 1] + bias[rec_file]
    gs = st + bias[row_file][:, None]
    q = np.searchsorted(g_start, gs, "right") - 1
    qc = np.maximum(q, 0)
    bad = (q < 0) | (rec_file[qc] != row_file[:, None]) | (en + bias[row_file][:, None] > g_end[qc])
    if bad.any():
        r, f = _first_bad(bad)
        raise _span_bad(
            names["starts"],
            span,
            row_file,
            first_row,
            r,
            f,
            st,
            en,
            "is not inside one of the file's pickles",
        )


def _span_bad(
    name: str,
    span: list[FileEntry],
    row_file: np.ndarray,
    first_row: np.ndarray,
    r: int,
    f: int,
    st: np.ndarray,
    en: np.ndarray,
    what: str,
) -> IndexProblem:
    s = int(row_file[r])
    e = span[s]
    return IndexProblem(
        name,
        f"row {r} (sample {r - int(first_row[s])}, field {f} of {e.path}, a file of {e.size} "
        f"bytes): span [{int(st[r, f])}, {int(en[r, f])}) {what}",
    )


def _check_externals(
    span: list[FileEntry],
    a: dict[str, np.ndarray],
    how: np.ndarray,
    row_file: np.ndarray,
    sizes: np.ndarray,
    names: dict[str, str],
) -> None:
    """CSR offsets grow and cover ``ext_keys``; each span's externals are sorted keys of its
    file's shared table, defined before the span (below its memo base)."""
    off, keys, mb = a["ext_offsets"], a["ext_keys"], a["memo_base"]
    nf = mb.shape[1]
    name = names["ext_offsets"]
    if (off[0] != 0) or (off[-1] != len(keys)) or bool((off[1:] < off[:-1]).any()):
        raise IndexProblem(name, f"offsets do not grow from 0 to the {len(keys)} keys")
    counts = np.array([f.num_samples for f in span], np.int64)
    ends = np.cumsum(counts * nf + 1) - 1  # each file's last offset ...
    if len(span) > 1 and bool((off[ends[:-1]] != off[ends[:-1] + 1]).any()):
        raise IndexProblem(name, "one file's offsets do not continue where the previous one's end")
    if not len(mb):
        if len(keys):
            raise IndexProblem(names["ext_keys"], "keys but no samples")
        return
    g = np.arange(mb.size, dtype=np.int64)  # span (r, f) is g = r * F + f
    lo = off[g + row_file.repeat(nf)]
    n = off[g + row_file.repeat(nf) + 1] - lo
    if int(n.sum()) != len(keys):
        raise IndexProblem(name, "offsets and keys disagree")
    flat_how = how[row_file].reshape(-1)
    if bool((n[flat_how == _ROW] != 0).any()):
        raise IndexProblem(name, "an array row has externals")
    if not len(keys):
        return
    key_span = np.repeat(g, n)
    kname = names["ext_keys"]
    if bool((keys < 0).any()) or bool((keys >= mb.reshape(-1)[key_span]).any()):
        raise IndexProblem(kname, "a span's external is not defined before it")
    same = key_span[1:] == key_span[:-1]
    if bool((same & (keys[1:] <= keys[:-1])).any()):
        raise IndexProblem(kname, "a span's externals are not sorted")
    # membership in the file's shared table, every file at once (keys made global by a bias)
    key_file = row_file[key_span // nf]
    bias = np.concatenate([[0], np.cumsum(sizes + 1)])[:-1]
    table = np.concatenate(
        [
            np.asarray((f.scan or {})["shared"]["keys"], np.int64) + bias[s]
            for s, f in enumerate(span)
        ]
    )
    gk = keys + bias[key_file]
    at = np.minimum(np.searchsorted(table, gk), len(table) - 1) if len(table) else None
    if at is None or bool((table[at] != gk).any()):
        raise IndexProblem(kname, "a span's external is not in its file's shared table")


def _check_items(
    span: list[FileEntry],
    a: dict[str, np.ndarray],
    how: np.ndarray,
    row_file: np.ndarray,
    first_row: np.ndarray,
    names: dict[str, str],
) -> None:
    """Span lengths agree with how each field is read: array rows exactly their bytes; small
    ints one opcode (and maybe a FRAME header); per-sample arrays room for exactly their
    payload between ``prefix`` and a framing tail no longer than the scanner allows."""
    st, en = a["starts"], a["ends"]
    length = en - st
    nf = st.shape[1]
    for f in range(nf):
        h = how[row_file, f]
        if (h == _INT).any():
            bad = (h == _INT) & ~np.isin(length[:, f], _INT_LENGTHS)
            if bad.any():
                r = int(np.argmax(bad))
                raise _span_bad(
                    names["ends"],
                    span,
                    row_file,
                    first_row,
                    r,
                    f,
                    st,
                    en,
                    "is not one small-int opcode",
                )
        for s in (
            np.flatnonzero(how[:, f] == _ROW).tolist() + np.flatnonzero(how[:, f] == _ITEM).tolist()
        ):
            e = span[s]
            assert e.scan is not None
            lo, hi = int(first_row[s]), int(first_row[s + 1])
            lens = length[lo:hi, f]
            if how[s, f] == _ROW:
                spec = ArrayRow.from_json(e.scan["arrays"][f])
                want = math.prod(spec.row_shape) * spec.dtype.itemsize
                bad = lens != want
                what = f"is not one {want}-byte array row"
            else:
                item = _item_from_json(e.scan["items"][f])
                assert isinstance(item, ArrayItem)
                want = math.prod(item.shape) * item.dtype.itemsize
                direct = np.ones(hi - lo, bool)
                direct[list(item.exceptions)] = False
                if not direct.any():
                    continue
                least = int(lens[direct].min())
                bad = direct & (lens != least) & (lens != least + _FRAME)
                what = "differs in length from the field's other arrays"
                if least < item.prefix + want or least - want > _MAX_TEMPLATE:
                    bad = direct
                    what = (
                        f"has no room for a {item.dtype} {item.shape} array "
                        f"({want} bytes) after {item.prefix} bytes"
                    )
            if bad.any():
                r = lo + int(np.argmax(bad))
                raise _span_bad(names["ends"], span, row_file, first_row, r, f, st, en, what)
