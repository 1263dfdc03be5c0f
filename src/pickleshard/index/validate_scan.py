"""Validation of one span file's scan descriptor (``files[k].scan`` of an untrusted index.json).

What a span reader allocates and parses comes from here, so each part is checked before any
read: the descriptor's format, size, protocol (2..5), fields and kinds; array-row and item
dtypes that hold no Python object (raw bytes read as object pointers crash the process) and
shapes of non-negative ints; item exceptions sorted sample numbers, never all of them; an item's
framing template (when stored) that declares the item's payload length and pushes its shape; a
shared table whose keys each lie inside their defining element and whose elements refer only to
keys defined before them (replays always go backwards: no cycle). :func:`check_scan_meta`
returns, per field, what the file's span lengths must agree with (checked against the arrays by
:mod:`pickleshard.index.contents`).
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np

from ..scan.ambiguity import Ambiguity
from ..scan.dtypes import dtype_from_json
from ..scan.filemeta import metadata_from_json
from ..scan.model import MAX_TEMPLATE as _MAX_TEMPLATE
from .checking import (
    INT,
    ITEM,
    PICKLE,
    ROW,
    FieldCheck,
    IndexProblem,
    show,
    want_dict,
    want_int,
    want_list,
    want_str,
)

__all__ = ["check_file_notes", "check_scan_meta"]


def _dtype(descr: Any, what: str) -> np.dtype[Any]:
    try:  # the one codec's checks: bounded depth, plain parts, a descr numpy reads
        dtype = dtype_from_json(descr)
    except Exception as exc:  # its ValueError, or whatever numpy makes of a bad descr
        raise IndexProblem("index.json", f"{what} {show(descr)} is not a dtype: {exc}") from None
    if dtype.hasobject:
        raise IndexProblem(
            "index.json", f"{what} {show(descr)} holds Python objects: never read raw"
        )
    return dtype


def _shape(v: Any, what: str) -> tuple[int, ...]:
    dims = want_list(v, what)
    if len(dims) > 32:
        raise IndexProblem("index.json", f"{what} has {len(dims)} dimensions")
    return tuple(want_int(d, f"{what}[{j}]") for j, d in enumerate(dims))


def check_scan_meta(meta: Any, at: str, size: int, nf: int, n: int) -> tuple[FieldCheck, ...]:
    """Check ``meta``, the scan descriptor at ``at`` of a span file of ``size`` bytes with
    ``nf`` fields and ``n`` samples; return each field's :class:`FieldCheck`. Raises
    :class:`IndexProblem`."""
    m = want_dict(meta, at)
    if m.get("format") != 1:
        raise IndexProblem("index.json", f"{at}.format is {show(m.get('format'))}, expected 1")
    if m.get("size") != size:
        raise IndexProblem(
            "index.json", f"{at}.size is {show(m.get('size'))}, the file's is {size}"
        )
    want_int(m.get("protocol"), f"{at}.protocol", lo=2, hi=pickle.HIGHEST_PROTOCOL)
    want_int(m.get("bytes_read"), f"{at}.bytes_read")
    want_int(m.get("num_records"), f"{at}.num_records")
    want_str(m.get("layout"), f"{at}.layout")
    if want_list(m.get("fields"), f"{at}.fields", nf) and not all(
        type(f) is str for f in m["fields"]
    ):
        raise IndexProblem("index.json", f"{at}.fields are not strings")
    kinds = want_list(m.get("kinds"), f"{at}.kinds", nf)
    arrays = want_list(m.get("arrays"), f"{at}.arrays", nf)
    items = m.get("items", [])
    if items:
        want_list(items, f"{at}.items", nf)
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
            r = want_dict(row, f"{at}.arrays[{f}]")
            dtype = _dtype(r.get("descr"), f"{at}.arrays[{f}].descr")
            shape = _shape(r.get("row_shape"), f"{at}.arrays[{f}].row_shape")
            if type(r.get("swap")) is not bool:
                raise IndexProblem("index.json", f"{at}.arrays[{f}].swap is not a boolean")
            checks.append(FieldCheck(ROW, math.prod(shape) * dtype.itemsize))
        elif item is not None:
            checks.append(_item(want_dict(item, f"{at}.items[{f}]"), f"{at}.items[{f}]", n))
        else:
            checks.append(FieldCheck(PICKLE))
    _shared(want_dict(m.get("shared"), f"{at}.shared"), f"{at}.shared", size)
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
    prefix = want_int(it.get("prefix"), f"{at}.prefix", lo=1, hi=_MAX_TEMPLATE)
    exc = want_list(it.get("exceptions"), f"{at}.exceptions")
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
            bytes.fromhex(want_str(it["head"], f"{at}.head")),
            bytes.fromhex(want_str(it.get("tail"), f"{at}.tail")),
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
        for r in want_list(it.get(key), f"{at}.{key}"):
            lo, hi = want_list(r, f"{at}.{key}[]", 2)
            want_int(lo, f"{at}.{key} start", hi=len(part))
            want_int(hi, f"{at}.{key} end", lo=lo + 1, hi=len(part))
    for b in want_list(it.get("bounds"), f"{at}.bounds"):
        want_int(b, f"{at}.bounds[]", hi=len(tail))
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
    keys = want_list(sh.get("keys"), f"{at}.keys")
    owner = want_list(sh.get("element_of"), f"{at}.element_of", len(keys))
    elements = want_list(sh.get("elements"), f"{at}.elements")
    bounds: list[tuple[int, int]] = []
    for j, el in enumerate(elements):
        s, e, b, x = want_list(el, f"{at}.elements[{j}]", 4)
        want_int(s, f"{at}.elements[{j}] start", hi=size)
        want_int(e, f"{at}.elements[{j}] end", lo=s + 1, hi=size)
        want_int(b, f"{at}.elements[{j}] memo base", hi=s)
        ext = want_list(x, f"{at}.elements[{j}] externals")
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


def check_file_notes(metadata: Any, ambiguity: Any, at: str) -> None:
    """A files-table row's ``metadata`` and ``ambiguity``: None, or what the builder writes."""
    try:
        if metadata is not None:
            metadata_from_json(metadata)
        if ambiguity is not None:
            Ambiguity.from_json(ambiguity)
    except ValueError as exc:
        raise IndexProblem("index.json", f"{at}: {exc}") from None
