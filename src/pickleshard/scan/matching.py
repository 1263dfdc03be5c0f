"""Layout matching on the opcode walker's nodes: which layout of :mod:`pickleshard.scan.layouts`
a pickle's top-level object is, its field names, and the span of every sample's field.

:func:`structure` decides the layout from container kinds alone, with the same decisions as
:func:`~pickleshard.scan.layouts.decode_layout` makes on the unpickled object;
:func:`fields_of` then evaluates what it must (dict keys, fields that are not containers, by the
:class:`~pickleshard.scan.inspector.Inspector`) and cuts the spans into columns.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FieldLengthMismatchError, NotSpanIndexableError
from ..picklekit.compiled import CORE
from ..picklekit.nodes import BOUNDS, DICT, ITEMS, KIND, LIST, START, TUPLE, Node, Value, start_of
from ..safety.standins import ArraySpec, EncodedBytes, Opaque, Payload
from .defaults import FieldFacts
from .filemeta import field_name, is_metadata
from .inspector import UNKNOWN, Inspector
from .layouts import (
    DICT_ROWS,
    Layout,
    LayoutChoice,
    NoLayout,
    UnknownRows,
    default_field_names,
    field_names,
    match_layout,
)
from .model import ArrayRow

__all__ = [
    "Candidate",
    "Field",
    "NotLayout",
    "RowSpans",
    "dict_rows",
    "facts_of",
    "fields_of",
    "leaves",
    "node_kind",
    "spans",
    "structure",
]


class NotLayout(Exception):
    """The object is not one of the layouts (the whole-file mode will say so precisely)."""


@dataclass
class Field:
    """One column of one pickle: element spans, or array rows."""

    starts: np.ndarray
    ends: np.ndarray
    array: ArrayRow | None = None


def _item_starts(node: Node) -> np.ndarray:
    items = node[ITEMS]
    if type(items) is array:  # a complete node: item offsets only, as int64
        return np.frombuffer(items, np.int64)
    if items and type(items[0]) is not int:  # nodes: np.array would try a ragged array first
        return np.fromiter((x if type(x) is int else x[START] for x in items), np.int64, len(items))
    try:
        return np.array(items, np.int64)
    except (TypeError, ValueError):  # some items are nodes
        return np.fromiter((x if type(x) is int else x[START] for x in items), np.int64, len(items))


def spans(nodes: Sequence[Node]) -> tuple[np.ndarray, np.ndarray]:
    """Start and end offsets of the items of ``nodes``, concatenated."""
    total = sum(len(n[ITEMS]) for n in nodes)
    if CORE is not None and total:  # the compiled twin: one C loop over items and bounds
        starts, ends = np.empty(total, np.int64), np.empty(total, np.int64)
        CORE.node_spans(list(nodes), starts, ends)
        return starts, ends
    return spans_py(nodes, total)


def spans_py(nodes: Sequence[Node], total: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`spans` in Python (``total``: the nodes' items together): the reference."""
    if len(nodes) <= 16:  # a few big nodes (columns): whole arrays at a time
        starts = np.concatenate([_item_starts(n) for n in nodes] or [np.zeros(0, np.int64)])
    else:  # many small nodes (rows)
        starts = np.fromiter(
            (x if type(x) is int else x[START] for n in nodes for x in n[ITEMS]), np.int64, total
        )
    ends = np.empty(total, np.int64)
    ends[:-1] = starts[1:]
    base = 0
    for n in nodes:
        b, prev = n[BOUNDS], 0
        for j in range(0, len(b), 2):
            if b[j] > prev:
                ends[base + b[j] - 1] = b[j + 1]
            prev = b[j]
        base += len(n[ITEMS])
    return starts, ends


def node_kind(v: Value) -> int:
    return v[KIND] if type(v) is list else 0  # type: ignore[no-any-return,unused-ignore]


@dataclass(frozen=True)
class RowSpans:
    """The items of a list's rows, as :func:`spans` of the row nodes gives them (``starts`` and
    ``ends``, one row after another) and each row's item count (``sizes``): what the compiled
    row pass (:mod:`pickleshard.scan.rows`) reports instead of nodes."""

    starts: np.ndarray
    ends: np.ndarray
    sizes: np.ndarray


@dataclass
class Candidate:
    """A top-level object that matches a layout structurally (opaque fields still unchecked)."""

    layout: Layout
    values: list[Value]  # columns: the field values; rows: the row nodes (none with ``rows``)
    ends: list[int]  # end offset of each value
    keys: list[tuple[int, int]]  # dict_columns: key spans
    top: str = ""  # the top-level container: "tuple", "list" or "dict"
    rows: RowSpans | None = None  # rows from the row pass, in place of row nodes

    def row_spans(self) -> RowSpans:
        """The rows' item spans and sizes (rows layouts)."""
        if self.rows is not None:
            return self.rows
        starts, ends = spans(self.values)
        sizes = np.fromiter((len(v[ITEMS]) for v in self.values), np.int64, len(self.values))
        return RowSpans(starts, ends, sizes)


_KIND_NAMES = {LIST: "list", TUPLE: "tuple", DICT: "dict"}


def _kind_name(v: Value) -> str:
    """:func:`~pickleshard.scan.layouts.match_layout`'s kind of a node; an opaque value (not a
    container the walker followed) is of unknown type."""
    return _KIND_NAMES.get(v[KIND], "other") if type(v) is list else "unknown"


def _size(v: Value) -> int:
    return len(v[ITEMS])


def structure(root: Value, name: str, choice: LayoutChoice = "auto") -> Candidate:
    """The layout of one pickle's top-level node, by :func:`match_layout` (the decisions
    :func:`pickleshard.scan.layouts.decode_layout` makes on the unpickled object, narrowed by
    ``choice``)."""
    top = _kind_name(root)
    values: list[Value] = list(root[ITEMS]) if type(root) is list else []
    items = values[1::2] if top == "dict" else values
    try:
        layout = match_layout(top, items, _kind_name, _size, choice)
    except UnknownRows as exc:
        raise NotSpanIndexableError(name, str(exc)) from None
    except NoLayout as exc:
        raise NotLayout(str(exc)) from None
    starts, ends = spans([root])
    vends = [int(e) for e in ends]
    if top == "dict":
        keys = [(int(s), int(e)) for s, e in zip(starts[0::2], ends[0::2], strict=True)]
        return Candidate(layout, items, vends[1::2], keys, top)
    return Candidate(layout, values, vends, [], top)


_KEY_TYPES = (str, bytes, int, float, complex, bool, type(None))


def _not_a_field(spec: Any) -> str | None:
    """Why an inspected top-level value is certainly not a field, or None if it may be one."""
    if isinstance(spec, ArraySpec):
        return None if spec.shape else "a 0-d numpy array is not a field"
    if spec is UNKNOWN or isinstance(spec, (list, tuple, Opaque)):
        return None
    return f"a top-level field is a {type(spec).__name__}, not a sequence"


def _array_field(spec: ArraySpec, name: str) -> Field:
    if spec.problem is not None or spec.payload is None or spec.dtype is None:
        raise NotSpanIndexableError(name, f"a field is a numpy array, but {spec.problem}")
    dtype = spec.dtype.newbyteorder("=") if spec.swap else spec.dtype
    row = ArrayRow(dtype, spec.shape[1:], spec.swap)
    starts = spec.payload.offset + np.arange(spec.shape[0], dtype=np.int64) * row.nbytes
    return Field(starts, starts + row.nbytes, row)


def leaves(cand: Candidate) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every element span of a candidate: items of its fields or rows, keys, opaque fields."""
    if cand.layout.sample == "item":
        return [_item_spans(cand)]
    if cand.layout.per_sample:
        flat = cand.row_spans()
        return [(flat.starts, flat.ends)]
    out = [spans([v]) for v in cand.values if type(v) is list]
    opaque = [
        (start_of(v), e) for v, e in zip(cand.values, cand.ends, strict=True) if type(v) is int
    ]
    out += [
        (np.array([s for s, _ in group], np.int64), np.array([e for _, e in group], np.int64))
        for group in (opaque, cand.keys)
        if group
    ]
    return out


def _item_spans(cand: Candidate) -> tuple[np.ndarray, np.ndarray]:
    """The spans of a top-level list's items (layout ``items``)."""
    starts = np.fromiter((start_of(v) for v in cand.values), np.int64, len(cand.values))
    return starts, np.array(cand.ends, np.int64)


def _metadata_value(spec: Any, encoding: str) -> tuple[bool, Any]:
    """``(True, value)`` when an inspected top-level value is file metadata
    (:func:`~pickleshard.scan.filemeta.is_metadata`); a skipped payload never is. A Python 2
    ``str`` payload is what ``encoding`` makes of it, as in :func:`pickle.load`."""
    if type(spec) is EncodedBytes:  # bytes at protocol <= 2
        spec = bytes(spec)
    if isinstance(spec, Payload):
        if len(spec) != spec.length or spec.kind not in ("bytes", "string"):
            return False, None
        raw = bytes(spec)
        spec = raw if spec.kind == "bytes" or encoding == "bytes" else raw.decode(encoding)
    return is_metadata(spec), spec


def _dict_order(keys: list[Any], name: str) -> dict[Any, int]:
    """``{key: position}`` as a dict built from these keys in order would hold them."""
    order: dict[Any, int] = {}
    for j, k in enumerate(keys):
        if type(k) is EncodedBytes:  # a bytes key at protocol <= 2
            k = bytes(k)
        if k is UNKNOWN or type(k) not in _KEY_TYPES:
            raise NotSpanIndexableError(name, "a dict key the scanner cannot evaluate")
        try:
            order[k] = j
        except TypeError:
            raise NotSpanIndexableError(name, "an unhashable dict key") from None
    return order


def facts_of(cand: Candidate, insp: Inspector) -> tuple[tuple[FieldFacts, ...], bool] | None:
    """The facts (:mod:`pickleshard.scan.defaults`) of a top-level dict's or tuple's values and
    whether it is keyed, as :func:`~pickleshard.scan.defaults.facts_of_object` gives them for
    the unpickled object; None for a top-level list, or where a value's type is not
    established (the whole-file load then decides)."""
    if cand.top not in ("dict", "tuple") or cand.layout.per_sample:
        return None
    out = []
    for v, end in zip(cand.values, cand.ends, strict=True):
        if type(v) is list:  # a container the walker followed
            kind = v[KIND]
            out.append(
                FieldFacts("sequence", len(v[ITEMS]), 1) if kind != DICT else FieldFacts("other")
            )
            continue
        spec = insp.value(v, end)
        if isinstance(spec, ArraySpec):
            out.append(
                FieldFacts("array", spec.shape[0], len(spec.shape))
                if spec.shape
                else FieldFacts("other")
            )
        elif _metadata_value(spec, insp.encoding)[0]:
            out.append(FieldFacts("other"))
        else:
            return None
    return tuple(out), cand.top == "dict"


def fields_of(
    cand: Candidate, insp: Inspector, name: str, meta: dict[str, Any] | None = None
) -> tuple[tuple[str, ...], list[Field]]:
    """Field names and columns of one pickle whose structure matched ``cand``; with ``meta``
    (a file of one pickle), a top-level dict's small scalar values go there by name instead
    of being refused as fields."""
    if cand.layout.sample == "item":
        return ("x",), [Field(*_item_spans(cand))]
    if cand.layout.sample == "tuple":
        flat = cand.row_spans()
        n = int(flat.sizes[0])
        starts, ends = flat.starts.reshape(-1, n), flat.ends.reshape(-1, n)
        return default_field_names(n), [Field(starts[:, f], ends[:, f]) for f in range(n)]
    if cand.layout.sample == "dict":
        return dict_rows(cand.row_spans(), insp, name)
    values, vends = cand.values, cand.ends
    if cand.layout.keyed:
        order = _dict_order([insp.key(s, e) for s, e in cand.keys], name)
        picked = list(order.items())
        if meta is not None:
            picked = []
            for k, j in order.items():
                v = values[j]
                found = (
                    (False, None)
                    if type(v) is list
                    else _metadata_value(insp.value(v, vends[j]), insp.encoding)
                )
                if found[0]:
                    meta[field_name(k)] = found[1]
                else:
                    picked.append((k, j))
        names = field_names([k for k, _ in picked], name)
        values, vends = [values[j] for _, j in picked], [vends[j] for _, j in picked]
    else:
        names = default_field_names(len(values))
    if not values:
        raise NotLayout("a top-level dict with no sequence values")
    opaque = {j: insp.value(v, vends[j]) for j, v in enumerate(values) if type(v) is not list}
    for why in filter(None, map(_not_a_field, opaque.values())):
        raise NotLayout(why)
    if any(not isinstance(sp, ArraySpec) for sp in opaque.values()):
        raise NotSpanIndexableError(
            name, "a top-level field whose type the scanner cannot establish"
        )
    lengths = [
        len(v[ITEMS]) if type(v) is list else opaque[j].shape[0] for j, v in enumerate(values)
    ]
    if len(set(lengths)) > 1:
        detail = ", ".join(f"len({f}) = {n}" for f, n in zip(names, lengths, strict=True))
        raise FieldLengthMismatchError(name, f"fields have different lengths: {detail}")
    cols = [
        Field(*spans([v])) if type(v) is list else _array_field(opaque[j], name)
        for j, v in enumerate(values)
    ]
    return names, cols


def _same_keys_as(buf: Any, ks: np.ndarray, ke: np.ndarray, ref: int) -> np.ndarray:
    """Which rows' key spans (``ks``/``ke``: rows x keys) hold exactly the bytes of row ``ref``'s:
    a row whose keys are the same opcodes (the same memo GETs, or the same literal strings) has
    the same keys in the same order, so its fields sit at the same places. All False where the
    buffer cannot be viewed as bytes (the rows are then evaluated one by one)."""
    try:
        raw = np.frombuffer(buf, np.uint8)
    except (TypeError, ValueError):
        return np.zeros(len(ks), bool)
    lengths = ke - ks
    same: np.ndarray = (lengths == lengths[ref]).all(axis=1)
    for j in range(ks.shape[1]):
        n = int(lengths[ref, j])
        want = raw[int(ks[ref, j]) : int(ks[ref, j]) + n]
        rows = np.flatnonzero(same)
        got = raw[ks[rows, j, None] + np.arange(n)]
        same[rows[~(got == want).all(axis=1)]] = False
    return same


def dict_rows(
    rows: list[Node] | RowSpans, insp: Inspector, name: str
) -> tuple[tuple[str, ...], list[Field]]:
    """Field names and columns of dict rows (row nodes, or their spans from the row pass)."""
    if not isinstance(rows, RowSpans):
        rows = Candidate(DICT_ROWS, rows, [], []).row_spans()
    starts, ends, sizes = rows.starts, rows.ends, rows.sizes
    bases = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=bases[1:])
    known = np.zeros(len(sizes), bool)
    picks = np.zeros((len(sizes), 0), np.int64)
    keys0: list[Any] | None = None
    r = 0
    while r < len(sizes):
        if known[r]:  # the next row still unknown: rows alike were placed in one step below
            left = np.flatnonzero(~known[r:])
            if not len(left):
                break
            r += int(left[0])
        base, n = int(bases[r]), int(sizes[r])
        order = _dict_order(
            [insp.key(int(starts[base + j]), int(ends[base + j])) for j in range(0, n, 2)], name
        )
        if keys0 is None:
            keys0 = list(order)
            picks = np.zeros((len(sizes), len(keys0)), np.int64)
        try:
            rel = np.array([2 * order[k] + 1 for k in keys0], np.int64)
        except KeyError as exc:
            raise NotLayout(f"per-sample dicts with different keys (missing {exc})") from None
        if len(order) != len(keys0):  # every key of the first, and more: none is dropped
            extra = next(k for k in order if k not in keys0)
            raise NotLayout(f"per-sample dicts with different keys (extra {extra!r})")
        picks[r] = base + rel
        known[r] = True
        # rows of as many items whose keys are the same bytes take the same places at once
        alike = np.flatnonzero(~known & (sizes == n))
        if len(alike):
            key_at = np.concatenate([[base], bases[alike]])[:, None] + np.arange(0, n, 2)
            same = _same_keys_as(insp.buf, starts[key_at], ends[key_at], 0)[1:]
            hit = alike[same]
            picks[hit] = bases[hit, None] + rel
            known[hit] = True
        r += 1
    return field_names(keys0 or (), name), [
        Field(starts[picks[:, f]], ends[picks[:, f]]) for f in range(picks.shape[1])
    ]
