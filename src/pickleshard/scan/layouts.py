"""The top-level layouts pickleshard recognises, and how a decoded file becomes columns.

A *layout* says how samples sit inside one unpickled object. Every layout is normalised to
*columns*: a tuple with one sequence per field, all of the same length, so that sample ``i`` is
``tuple(col[i] for col in columns)``.

=================  ==========================================  =====================
layout             top-level object                            field names
=================  ==========================================  =====================
``columns``        ``(x_list, y_list, ...)`` (tuple or list)    ``x``, ``y``, ``f2``...
``dict_columns``   ``{"x": [...], "y": [...]}``                 the dict's keys
``rows``           ``[(x, y), (x, y), ...]``                    ``x``, ``y``, ``f2``...
``dict_rows``      ``[{"x": ..., "y": ...}, ...]``              the first row's keys
=================  ==========================================  =====================

A field may be a list, a tuple or a numpy array of shape ``(N, ...)`` (row ``i`` is sample ``i``).

A file may hold several pickles one after another (one ``pickle.dump`` call each);
:func:`decode_records` reads them by the rules of :mod:`pickleshard.scan`, so that whole-file
and span reading agree:

=========================  ===================================  ==========================
layout                     pickles                              field names
=========================  ===================================  ==========================
``appended_<layout>``      every one a layout above, same       those of the first
                           layout and fields: *chunks*,
                           samples concatenated in file order
``appended_samples``       otherwise, one sample per pickle:    ``x``, ``y``, ``f2``... for
                           exact tuples of one length, or       tuples; ``x`` otherwise
                           any objects (the single field)
``appended_dict_samples``  exact dicts, one sample each         the first dict's keys
=========================  ===================================  ==========================

These rows are :data:`LAYOUT_TABLE` (:class:`Layout`, keyed by name without ``appended_``), and
:func:`match_layout` is the one set of decisions that picks a row for a top-level object: run
by :func:`decode_layout` on the unpickled object and by the scanner on the opcode walker's
nodes (:mod:`pickleshard.scan.matching`). The split writer and the test oracle dispatch on the
table's entries (:func:`layout_named`) rather than on names.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from ..errors import FieldLengthMismatchError, UnsupportedLayoutError

__all__ = [
    "APPENDED",
    "LAYOUTS",
    "LAYOUT_TABLE",
    "Columns",
    "DecodedLayout",
    "Layout",
    "NoLayout",
    "decode_layout",
    "decode_records",
    "default_field_names",
    "layout_named",
    "match_layout",
]

# A top-level *list* of sequences is read as columns only up to this many fields; longer lists
# of lists are far more likely per-sample rows, and guessing wrong would be silent.
MAX_LIST_FIELDS = 64
T = TypeVar("T")
APPENDED = "appended_"  # prefix of a layout read across appended pickles, one chunk each


@dataclass(frozen=True)
class Layout:
    """One way samples sit in a file: the table every reader of layouts dispatches on.

    ``top``: the containers the top-level object may be (empty: one sample per pickle, in a
    file of appended pickles). ``sample``: ``"column"`` when the top-level object's items are
    the fields (sample ``i`` is item ``i`` of each), ``"tuple"`` / ``"dict"`` when each sample is
    one such container (a row, or a whole pickle). ``keyed``: field names are dict keys (else
    :func:`default_field_names`).
    """

    name: str
    top: tuple[str, ...]
    sample: str
    keyed: bool

    @property
    def per_sample(self) -> bool:
        """Each sample is its own container (rows, or one pickle each): no column to read."""
        return self.sample != "column"

    @property
    def rows(self) -> bool:
        """Each sample is one row (a tuple or dict) of a top-level list."""
        return self.per_sample and not self.per_pickle

    @property
    def per_pickle(self) -> bool:
        """One sample per appended pickle."""
        return not self.top


COLUMNS = Layout("columns", ("tuple", "list"), "column", keyed=False)
DICT_COLUMNS = Layout("dict_columns", ("dict",), "column", keyed=True)
ROWS = Layout("rows", ("list",), "tuple", keyed=False)
DICT_ROWS = Layout("dict_rows", ("list",), "dict", keyed=True)
# Appended pickles only: any object that is not an exact tuple or dict is the single field x.
SAMPLES = Layout("samples", (), "tuple", keyed=False)
DICT_SAMPLES = Layout("dict_samples", (), "dict", keyed=True)
LAYOUT_TABLE = {x.name: x for x in (COLUMNS, DICT_COLUMNS, ROWS, DICT_ROWS, SAMPLES, DICT_SAMPLES)}
LAYOUTS = tuple(name for name, x in LAYOUT_TABLE.items() if not x.per_pickle)


def layout_named(name: str, path: str | os.PathLike[str]) -> Layout:
    """The table's entry for a layout name as files and indexes carry it (``appended_`` or
    not); :class:`UnsupportedLayoutError` naming ``path`` for a name not in the table (an
    index is untrusted input)."""
    try:
        return LAYOUT_TABLE[name.removeprefix(APPENDED)]
    except KeyError:
        raise UnsupportedLayoutError(
            path, f"unknown layout {name!r}; this pickleshard knows {', '.join(LAYOUT_TABLE)}"
        ) from None


class NoLayout(ValueError):
    """The top-level object is none of the layouts; ``str()`` says why."""


class UnknownRows(NoLayout):
    """A list that starts as rows of tuples holds items whose type is not established (only the
    scanner, which does not run code, meets these)."""


# What :func:`match_layout`'s ``kind`` answers: a container, a numpy array with at least one
# dimension, a value whose type is not established (the scanner's opaque nodes), or other.
_FIELD_KINDS = frozenset(("tuple", "list", "array", "unknown"))


def match_layout(
    top: str, items: Sequence[T], kind: Callable[[T], str], size: Callable[[T], int]
) -> Layout:
    """The layout of a top-level object of container kind ``top`` (``"tuple"``, ``"list"``,
    ``"dict"``) whose items (a dict's values) are ``items``: the one set of decisions that both
    :func:`decode_layout` (on the unpickled object) and the scanner (on the opcode walker's
    nodes, :mod:`pickleshard.scan.matching`) make. ``kind(x)`` is ``"tuple"``, ``"list"``,
    ``"dict"``, ``"array"``, ``"unknown"`` or ``"other"``; ``size(x)`` is a container's length.
    A field may be anything but a dict or an ``"other"`` value; whether an ``"unknown"`` one
    really is a field is the caller's to check. Raises :class:`NoLayout` with the reason.
    """
    if top not in ("tuple", "list", "dict") or not items:
        raise NoLayout("the top-level object is not a non-empty list, tuple or dict")
    fields = all(kind(v) in _FIELD_KINDS for v in items)
    if top == "dict":
        if fields:
            return DICT_COLUMNS
        raise NoLayout("a top-level dict whose values are not all sequences")
    if top == "tuple":
        if fields:
            return COLUMNS
        raise NoLayout("a top-level tuple whose items are not all sequences")
    first = kind(items[0])
    if first == "tuple" and size(items[0]):
        n = size(items[0])
        if all(kind(r) == "tuple" and size(r) == n for r in items):
            return ROWS
        if any(kind(r) == "unknown" for r in items):
            raise UnknownRows("a list of tuples with some rows of unknown type")
    if first == "dict":
        if all(kind(r) == "dict" for r in items):
            return DICT_ROWS
        raise NoLayout("a list of dicts with some rows of other types")
    if len(items) <= MAX_LIST_FIELDS and fields:
        return COLUMNS
    raise NoLayout(f"a top-level list that is neither rows nor at most {MAX_LIST_FIELDS} columns")


_EXPECTED = (
    "expected (x_list, y_list, ...) as a tuple or list of equal-length sequences, "
    "a dict of equal-length sequences, a list of per-sample tuples, or a list of per-sample dicts"
)

Columns = tuple[Sequence[Any], ...]


@dataclass(frozen=True)
class DecodedLayout:
    layout: str
    fields: tuple[str, ...]
    columns: Columns

    @property
    def num_samples(self) -> int:
        return len(self.columns[0]) if self.columns else 0


def default_field_names(n: int) -> tuple[str, ...]:
    base = ("x", "y")
    return tuple(base[i] if i < len(base) else f"f{i}" for i in range(n))


def _kind(obj: object) -> str:
    """:func:`match_layout`'s kind of an unpickled value (subclasses count as their base)."""
    if isinstance(obj, dict):
        return "dict"
    if isinstance(obj, tuple):
        return "tuple"
    if isinstance(obj, list):
        return "list"
    if isinstance(obj, np.ndarray) and obj.ndim >= 1:
        return "array"
    return "other"


def _describe(obj: object) -> str:
    name = type(obj).__name__
    if isinstance(obj, np.ndarray):
        return f"ndarray of shape {obj.shape}"
    if isinstance(obj, (list, tuple, dict)):
        return f"{name} of length {len(obj)}"
    return name


def _check_lengths(path: str, fields: Sequence[str], columns: Columns) -> None:
    lengths = [len(c) for c in columns]
    if len(set(lengths)) > 1:
        detail = ", ".join(f"len({f}) = {n}" for f, n in zip(fields, lengths, strict=True))
        raise FieldLengthMismatchError(path, f"fields have different lengths: {detail}")


def decode_layout(obj: object, path: str | os.PathLike[str]) -> DecodedLayout:
    """Recognise the layout of an unpickled top-level object and return it as columns.

    Raises :class:`UnsupportedLayoutError` (naming ``path``) for anything else, and
    :class:`FieldLengthMismatchError` when the fields of a columns layout differ in length.
    """
    where = os.fspath(path)
    top = _kind(obj)
    items: Sequence[Any] = ()
    if top == "dict":
        items = list(cast(dict[Any, Any], obj).values())
    elif top in ("tuple", "list"):
        items = cast(Sequence[Any], obj)
    try:
        layout = match_layout(top, items, _kind, len)
    except NoLayout:
        if top == "dict":
            raise UnsupportedLayoutError(
                where, f"top-level dict whose values are not all sequences; {_EXPECTED}"
            ) from None
        raise UnsupportedLayoutError(
            where, f"top-level object is {_describe(obj)}; {_EXPECTED}"
        ) from None
    keys: tuple[Any, ...]
    if not layout.per_sample:
        keys = tuple(cast(dict[Any, Any], obj)) if layout.keyed else ()
        fields = tuple(str(k) for k in keys) if layout.keyed else default_field_names(len(items))
        columns = tuple(items)
        _check_lengths(where, fields, columns)
        return DecodedLayout(layout.name, fields, columns)
    if layout.sample == "tuple":
        fields = default_field_names(len(items[0]))
        return DecodedLayout(layout.name, fields, tuple(zip(*items, strict=True)))
    keys = tuple(items[0])
    try:
        columns = tuple([r[k] for r in items] for k in keys)
    except KeyError as exc:
        raise UnsupportedLayoutError(
            where, f"per-sample dicts with different keys (missing {exc}); {_EXPECTED}"
        ) from None
    return DecodedLayout(layout.name, tuple(str(k) for k in keys), columns)


def _concat(parts: Sequence[Sequence[Any]]) -> Sequence[Any]:
    """One column from its chunks: arrays of one dtype and row shape stay an array."""
    if all(isinstance(p, np.ndarray) for p in parts):
        arrays: list[np.ndarray] = list(parts)  # type: ignore[arg-type]
        first = arrays[0]
        if all(a.dtype == first.dtype and a.shape[1:] == first.shape[1:] for a in arrays):
            return cast(Sequence[Any], np.concatenate(arrays))
    return list(itertools.chain.from_iterable(parts))


def _one_per_record(objs: Sequence[Any], where: str) -> DecodedLayout:
    first = objs[0]
    if type(first) is tuple and first:
        if not all(type(o) is tuple and len(o) == len(first) for o in objs):
            raise UnsupportedLayoutError(
                where, "appended pickles are samples of different shapes (tuples of one length)"
            )
        fields = default_field_names(len(first))
        return DecodedLayout(APPENDED + SAMPLES.name, fields, tuple(zip(*objs, strict=True)))
    if type(first) is dict and first:
        # types first: a list or an array indexed by a key is an IndexError, not a KeyError
        if not all(type(o) is dict for o in objs):
            raise UnsupportedLayoutError(where, "appended pickles are samples of different shapes")
        keys = tuple(first)
        try:
            columns = tuple([o[k] for o in objs] for k in keys)
        except KeyError:
            raise UnsupportedLayoutError(
                where, "appended pickles are per-sample dicts with different keys"
            ) from None
        return DecodedLayout(APPENDED + DICT_SAMPLES.name, tuple(str(k) for k in keys), columns)
    return DecodedLayout(APPENDED + SAMPLES.name, ("x",), (list(objs),))


def decode_records(objs: Sequence[Any], path: str | os.PathLike[str]) -> DecodedLayout:
    """Samples of a file holding the pickles ``objs`` (one per ``pickle.dump`` call).

    One pickle is :func:`decode_layout`. Several are chunks when every one is a layout with the
    same fields (layout ``appended_<layout of the first>``, samples in file order), and otherwise
    one sample each (see the module docstring).
    """
    where = os.fspath(path)
    if len(objs) == 1:
        return decode_layout(objs[0], where)
    if not objs:
        raise UnsupportedLayoutError(where, f"the file holds no pickle; {_EXPECTED}")
    try:
        chunks = [decode_layout(o, where) for o in objs]
    except UnsupportedLayoutError:
        return _one_per_record(objs, where)
    first = chunks[0]
    for r, chunk in enumerate(chunks[1:], start=2):
        if chunk.fields != first.fields:
            raise UnsupportedLayoutError(
                where,
                f"appended pickle #{r} has fields {list(chunk.fields)}, "
                f"the first {list(first.fields)}",
            )
    columns = tuple(_concat([c.columns[f] for c in chunks]) for f in range(len(first.fields)))
    return DecodedLayout(APPENDED + first.layout, first.fields, columns)
