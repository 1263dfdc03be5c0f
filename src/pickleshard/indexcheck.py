"""Validation of an index read from disk: it is untrusted input, like the data it describes.

An index shipped with a downloaded dataset can be edited as easily as the pickles. Every read
path trusts what :class:`~pickleshard.index.DatasetIndex` hands it (offsets it ``pread``\\ s,
dtypes and shapes it allocates, memo ids it renumbers, rows it slices), so every part is
checked once, when the index is opened, and a violation raises
:class:`~pickleshard.errors.IndexFormatError` naming the index file and what is wrong. This
module checks ``index.json`` (:func:`check_header`); :mod:`pickleshard.indexarrays` the
``.npy`` files and their contents against it:

- types and ranges of every header, files-table and skipped-files entry (``bool`` is not an
  int, a count is not a string); file paths relative and inside the dataset directory, each
  named once; array file names plain names of the index directory; counts that add up (files,
  samples, modes); the rows each span file takes in the span arrays exactly where the builder
  puts them (rows can be neither shared nor moved between files);
- each span file's scan: its format, size, protocol (2..5), fields and kinds; array-row and
  item dtypes that hold no Python object (raw bytes read as object pointers crash the process)
  and shapes of non-negative ints; item exceptions sorted sample numbers, never all of them; an
  item's framing template (when stored) that declares the item's payload length and pushes its
  shape; a shared table whose keys each lie inside their defining element and whose elements
  refer only to keys defined before them (replays always go backwards: no cycle).

What the index alone cannot tell (a span's bytes edited with it) is the read path's business:
:mod:`pickleshard.spanread` checks one sample of each array field against a real unpickling
(and, with issue 12's read-time checks, every payload's framing).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from .errors import IndexFormatError
from .indexfiles import SPAN_ARRAYS, FileEntry
from .scan.model import MAX_TEMPLATE as _MAX_TEMPLATE

__all__ = [
    "ARRAY_NAME",
    "INT",
    "ITEM",
    "PICKLE",
    "ROW",
    "FieldCheck",
    "IndexProblem",
    "check_header",
]

# a file of the index directory: a plain name, never a path (``pickleshard index`` deletes the
# arrays an old header names, so a name must never reach outside that directory)
ARRAY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\.npy")
_MAX_ID = 1 << 62  # any count or offset of a real index is far below this
PICKLE, ROW, INT, ITEM = range(4)  # how a (file, field) is read, as the readers decide


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


@dataclass(frozen=True)
class FieldCheck:
    """What the span lengths of one field of one file must agree with, from its descriptor:
    ``how`` it is read (``PICKLE``, ``ROW``, ``INT``, ``ITEM``); ``nbytes`` of a row (``ROW``) or
    of a payload (``ITEM``); an item's ``prefix``, ``exceptions`` and the length of its
    template's ``tail`` (-1 when none is stored)."""

    how: int
    nbytes: int = 0
    prefix: int = 0
    tail: int = -1
    exceptions: tuple[int, ...] = ()


# -- index.json ----------------------------------------------------------------------------------


def read_header(where: Path) -> dict[str, Any]:
    """The parsed ``index.json`` of index directory ``where``; raises IndexFormatError when
    it is missing, not a regular file (a FIFO must not hang the open), not JSON (or nested
    too deeply for the parser), or not a JSON object."""
    path = where / "index.json"
    advice = "; rebuild it with `pickleshard index` or rebuild='auto'"
    try:
        # O_NONBLOCK: a FIFO planted as index.json must not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise IndexFormatError(where, "no index.json; build one with `pickleshard index`") from None
    except OSError as exc:
        raise IndexFormatError(path, f"cannot read: {exc.strerror or exc}{advice}") from None
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IndexFormatError(path, f"is not a regular file{advice}")
        try:
            header = json.loads(fh.read())
        except (OSError, ValueError, RecursionError) as exc:
            what = "nested too deeply" if isinstance(exc, RecursionError) else exc
            raise IndexFormatError(path, f"cannot read: {what}{advice}") from None
    if not isinstance(header, dict):
        raise IndexFormatError(path, f"is not a JSON object{advice}")
    return header


def _int(v: Any, what: str, lo: int = 0, hi: int = _MAX_ID, *, none: bool = False) -> Any:
    if v is None and none:
        return None
    if type(v) is not int or not lo <= v <= hi:
        raise IndexProblem(
            "index.json", f"{what} is {show(v)}, expected an integer in [{lo}, {hi}]"
        )
    return v


def _str(v: Any, what: str, *, none: bool = False) -> Any:
    if (v is None and none) or type(v) is str:
        return v
    raise IndexProblem("index.json", f"{what} is {show(v)}, expected a string")


def _list(v: Any, what: str, n: int | None = None) -> list[Any]:
    if type(v) is not list or (n is not None and len(v) != n):
        want = "a list" if n is None else f"a list of {n}"
        raise IndexProblem("index.json", f"{what} is {show(v)}, expected {want}")
    return v


def _dict(v: Any, what: str) -> dict[str, Any]:
    if type(v) is not dict:
        raise IndexProblem("index.json", f"{what} is {show(v)}, expected an object")
    return v


def show(v: Any) -> str:
    """``repr(v)``, cut to 60 characters."""
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


def _file_entry(obj: Any, k: int, fields: list[str]) -> tuple[FileEntry, tuple[FieldCheck, ...]]:
    at = f"files[{k}]"
    row = _dict(obj, at)
    extra, missing = set(row) - _FILE_KEYS, {"path", "size", "mode", "ctime_ns", "ino"} - set(row)
    if extra or missing:
        raise IndexProblem("index.json", f"{at} has keys {sorted(extra)} / lacks {sorted(missing)}")
    _rel_path(row["path"], f"{at}.path")
    for key in ("size", "num_samples", "decoded_nbytes"):
        _int(row.get(key), f"{at}.{key}", hi=(1 << 32) - 1 if key == "num_samples" else _MAX_ID)
    _int(row.get("mtime_ns"), f"{at}.mtime_ns", lo=-_MAX_ID)
    # required (version 3 always writes them): without them the staleness check rests on
    # size, mtime and fingerprint alone, which an archive carries to any machine, so an edited
    # index would pass for fresh next to a downloaded dataset
    _int(row.get("ctime_ns"), f"{at}.ctime_ns", lo=-_MAX_ID)
    _int(row.get("ino"), f"{at}.ino")
    for key in ("fingerprint", "layout"):
        _str(row.get(key), f"{at}.{key}")
    _str(row.get("reason"), f"{at}.reason", none=True)
    if row.get("fields") != fields:
        raise IndexProblem("index.json", f"{at}.fields is {show(row.get('fields'))}, not {fields}")
    mode = row["mode"]
    if mode not in ("span", "whole"):
        raise IndexProblem("index.json", f"{at}.mode is {show(mode)}, expected 'span' or 'whole'")
    for key in ("span_row", "ext_row", "record_row"):
        _int(row.get(key, -1), f"{at}.{key}", lo=-1)
    if mode == "whole" and (row.get("scan") is not None or row.get("span_row", -1) != -1):
        raise IndexProblem("index.json", f"{at} is read whole but names span rows")
    checks: tuple[FieldCheck, ...] = ()
    if mode == "span":
        checks = _scan_meta(
            row.get("scan"), f"{at}.scan", row["size"], len(fields), row["num_samples"]
        )
    return FileEntry.from_json(row), checks


def _dtype(descr: Any, what: str) -> np.dtype[Any]:
    try:
        dtype = np.lib.format.descr_to_dtype(_tuples_checked(descr, what))
    except IndexProblem:
        raise
    except Exception as exc:  # whatever numpy makes of a bad descr
        raise IndexProblem("index.json", f"{what} {show(descr)} is not a dtype: {exc}") from None
    if dtype.hasobject:
        raise IndexProblem(
            "index.json", f"{what} {show(descr)} holds Python objects: never read raw"
        )
    return dtype


def _tuples_checked(descr: Any, what: str, depth: int = 0) -> Any:
    """:func:`pickleshard.scan.dtypes.dtype_from_json`'s checks, as index problems."""
    if type(descr) is str:
        return descr
    if depth > 8 or type(descr) is not list:
        raise IndexProblem("index.json", f"{what} is not a dtype descr")
    out = []
    for entry in descr:
        if type(entry) is not list or not 2 <= len(entry) <= 3:
            raise IndexProblem("index.json", f"{what} has a field entry {show(entry)}")
        name = entry[0]
        if type(name) is list:
            if len(name) != 2 or not all(type(x) is str for x in name):
                raise IndexProblem("index.json", f"{what} has a field name {show(name)}")
            name = tuple(name)
        elif type(name) is not str:
            raise IndexProblem("index.json", f"{what} has a field name {show(name)}")
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


def _scan_meta(meta: Any, at: str, size: int, nf: int, n: int) -> tuple[FieldCheck, ...]:
    m = _dict(meta, at)
    if m.get("format") != 1:
        raise IndexProblem("index.json", f"{at}.format is {show(m.get('format'))}, expected 1")
    if m.get("size") != size:
        raise IndexProblem(
            "index.json", f"{at}.size is {show(m.get('size'))}, the file's is {size}"
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
    checks = []
    for f, kind in enumerate(kinds):
        if kind not in ("pickle", "array_row"):
            raise IndexProblem("index.json", f"{at}.kinds[{f}] is {show(kind)}")
        row, item = arrays[f], items[f] if items else None
        if (row is not None) != (kind == "array_row") or (kind == "array_row" and item):
            raise IndexProblem(
                "index.json", f"{at}: field {f} is {kind} but has arrays/items entries"
            )
        if row is not None:
            r = _dict(row, f"{at}.arrays[{f}]")
            dtype = _dtype(r.get("descr"), f"{at}.arrays[{f}].descr")
            shape = _shape(r.get("row_shape"), f"{at}.arrays[{f}].row_shape")
            if type(r.get("swap")) is not bool:
                raise IndexProblem("index.json", f"{at}.arrays[{f}].swap is not a boolean")
            checks.append(FieldCheck(ROW, math.prod(shape) * dtype.itemsize))
        elif item is not None:
            checks.append(_item(_dict(item, f"{at}.items[{f}]"), f"{at}.items[{f}]", n))
        else:
            checks.append(FieldCheck(PICKLE))
    _shared(_dict(m.get("shared"), f"{at}.shared"), f"{at}.shared", size)
    return tuple(checks)


def _item(it: dict[str, Any], at: str, n: int) -> FieldCheck:
    if it.get("kind") == "int":
        if set(it) != {"kind"}:
            raise IndexProblem("index.json", f"{at} is an int item with other keys")
        return FieldCheck(INT)
    dtype = _dtype(it.get("descr"), f"{at}.descr")
    shape = _shape(it.get("shape"), f"{at}.shape")
    nbytes = math.prod(shape) * dtype.itemsize
    for key in ("swap", "readonly"):
        if type(it.get(key)) is not bool:
            raise IndexProblem(
                "index.json", f"{at}.{key} is {show(it.get(key))}, expected a boolean"
            )
    prefix = _int(it.get("prefix"), f"{at}.prefix", lo=1, hi=_MAX_TEMPLATE)
    exc = _list(it.get("exceptions"), f"{at}.exceptions")
    if not all(type(e) is int for e in exc) or any(
        not 0 <= a < b for a, b in zip(exc, [*exc[1:], n], strict=False)
    ):
        raise IndexProblem("index.json", f"{at}.exceptions are not sorted sample numbers below {n}")
    if n and len(exc) >= n:
        raise IndexProblem("index.json", f"{at}: every sample is an exception")
    tail = _template(it, at, prefix, shape, nbytes) if "head" in it else -1
    return FieldCheck(ITEM, nbytes, prefix, tail, tuple(exc))


# the opcodes that may end an item's head, declaring the payload's length: (opcode, bytes of it)
_PAYLOAD_HEADS = tuple(
    (op[0], k)
    for op, k in (
        (pickle.SHORT_BINBYTES, 1),
        (pickle.BINBYTES, 4),
        (pickle.BINBYTES8, 8),
        (pickle.BYTEARRAY8, 8),
    )
)


def _template(it: dict[str, Any], at: str, prefix: int, shape: tuple[int, ...], nbytes: int) -> int:
    """Check an item's stored framing template (``head``, ``tail``, masked ranges, FRAME
    bounds) against its prefix, shape and payload size; return the tail's length. (Its dtype
    and shape are settled by the reader's check of one sample against a real unpickling, and
    the framing check makes every sample alike: decoding them here would be a second, partial
    unpickler, stricter than the scanner on valid files that encode ints or tuples otherwise.)"""
    try:
        head, tail = (
            bytes.fromhex(_str(it["head"], f"{at}.head")),
            bytes.fromhex(_str(it.get("tail"), f"{at}.tail")),
        )
    except ValueError:
        raise IndexProblem("index.json", f"{at}: head/tail are not hex") from None
    if len(head) != prefix or len(head) + len(tail) > _MAX_TEMPLATE:
        raise IndexProblem(
            "index.json",
            f"{at}: a {len(head)}-byte head and {len(tail)}-byte tail do not fit "
            f"its prefix {prefix}",
        )
    for key, part in (("head_masked", head), ("tail_masked", tail)):
        for r in _list(it.get(key), f"{at}.{key}"):
            lo, hi = _list(r, f"{at}.{key}[]", 2)
            _int(lo, f"{at}.{key} start", hi=len(part))
            _int(hi, f"{at}.{key} end", lo=lo + 1, hi=len(part))
    for b in _list(it.get("bounds"), f"{at}.bounds"):
        _int(b, f"{at}.bounds[]", hi=len(tail))
    # the head ends with the payload's opcode and length: it must declare exactly the bytes
    # that the item's dtype and shape read
    declared = {
        int.from_bytes(head[len(head) - k :], "little")
        for op, k in _PAYLOAD_HEADS
        if len(head) > k and head[len(head) - k - 1] == op
    }
    if nbytes not in declared:
        raise IndexProblem(
            "index.json",
            f"{at}: its template declares a payload of {sorted(declared)} bytes, "
            f"its dtype and shape read {nbytes}",
        )
    return len(tail)


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
            raise IndexProblem("index.json", f"{at}: key {k} is {show(key)} of element {show(j)}")
        if not bounds[j][0] <= key < bounds[j][1]:
            raise IndexProblem("index.json", f"{at}: key {key} is not defined in element {j}")
        last = key
    defined = set(keys)
    for j, el in enumerate(elements):
        if not set(el[3]) <= defined:
            raise IndexProblem(
                "index.json", f"{at}.elements[{j}] needs keys the table does not define"
            )


def check_header(
    header: dict[str, Any],
) -> tuple[list[FileEntry], list[dict[str, Any]], list[tuple[FieldCheck, ...]]]:
    """The files table and skipped files of a header of the current version, checked; raises
    ``IndexProblem``. The array names and checksums are checked too (not the arrays themselves)."""
    fields = _list(header.get("fields"), "fields")
    if not all(type(f) is str for f in fields) or len(set(fields)) != len(fields):
        raise IndexProblem("index.json", f"fields {show(fields)} are not distinct strings")
    files_json = _list(header.get("files"), "files")
    files: list[FileEntry] = []
    checks: list[tuple[FieldCheck, ...]] = []  # per span file
    for k, obj in enumerate(files_json):
        entry, check = _file_entry(obj, k, fields)
        files.append(entry)
        if entry.mode == "span":
            checks.append(check)
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
            f"num_samples {show(header.get('num_samples'))} / num_files "
            f"{show(header.get('num_files'))} disagree with the files table ({n} / {len(files)})",
        )
    modes = {m: sum(f.mode == m for f in files) for m in ("span", "whole")}
    if header.get("modes") != modes:
        raise IndexProblem(
            "index.json", f"modes {show(header.get('modes'))}, the files table has {modes}"
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
                "index.json", f"arrays.{key} {show(name)} is not a file of the index"
            )
        if type(sums[key]) is not str or not re.fullmatch(r"crc32:[0-9a-f]{8}", sums[key]):
            raise IndexProblem("index.json", f"checksums.{key} is {show(sums[key])}")
    if len(set(names.values())) != len(names):
        raise IndexProblem("index.json", "two arrays share a file")
    total = sum(f.size + 1 for f in files)  # the array checks add sizes up in int64
    if total >= _MAX_ID or sum(f.decoded_nbytes for f in files) >= _MAX_ID:
        raise IndexProblem("index.json", "file sizes add up to more than any dataset holds")
    return files, skipped, checks


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
