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
:func:`pickleshard.scan.records.decode_records` reads them by the rules of :mod:`pickleshard.scan`, so that whole-file
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

``items`` (a top-level list whose items are the samples, any objects, the single field ``x``) is
read only when asked for (``layout="records"``).

What the user may name (:data:`LAYOUT_CHOICES`, the ``layout=`` argument everywhere, each
described in words by :data:`LAYOUT_CHOICE_HELP`, which the CLI's ``--layout`` reads): ``"auto"``
infers as above and notes when another reading is as plausible
(:mod:`pickleshard.scan.ambiguity`); ``"columns"`` reads every pickle as ``columns`` or
``dict_columns``; ``"records"`` reads each appended pickle as one sample, or, in a file of one
pickle, each item of its top-level list (``rows``, ``dict_rows``, ``items``; another top-level
object is the one sample); ``"file"`` reads the file's one pickle as one sample.

In a file of one pickle, a top-level dict's small scalar values (``b"batch_label"`` beside
CIFAR's columns) are the file's metadata, not fields (:mod:`pickleshard.scan.filemeta`); dict
keys name fields by :func:`~pickleshard.scan.filemeta.field_name` (``bytes`` by their text).

These rows are :data:`LAYOUT_TABLE` (:class:`Layout`, keyed by name without ``appended_``; a
read-only view: a row is chosen only by a decision in :func:`match_layout`), and
:func:`match_layout` is the one set of decisions that picks a row for a top-level object: run
by :func:`decode_layout` on the unpickled object and by the scanner on the opcode walker's
nodes (:mod:`pickleshard.scan.matching`). The split writer and the test oracle dispatch on the
table's entries (:func:`layout_named`) rather than on names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeVar, cast

import numpy as np

from ..errors import FieldLengthMismatchError, UnsupportedLayoutError
from .ambiguity import Ambiguity
from .filemeta import field_name, is_metadata

__all__ = [
    "APPENDED",
    "EXPECTED_LAYOUTS",
    "LAYOUTS",
    "LAYOUT_CHOICES",
    "LAYOUT_CHOICE_HELP",
    "LAYOUT_TABLE",
    "Columns",
    "DecodedLayout",
    "Layout",
    "LayoutChoice",
    "NoLayout",
    "check_layout_choice",
    "decode_layout",
    "default_field_names",
    "field_names",
    "layout_named",
    "match_layout",
]

# A top-level *list* of sequences is read as columns only up to this many fields; longer lists
# of lists are far more likely per-sample rows, and guessing wrong would be silent.
MAX_LIST_FIELDS = 64
T = TypeVar("T")
APPENDED = "appended_"  # prefix of a layout read across appended pickles, one chunk each
LayoutChoice = Literal["auto", "columns", "records", "file"]
#: what each ``layout=`` value (CLI ``--layout``) reads a file as, in words; the choices are
#: readings that the matching below, the scanner and the record reader each implement, so this
#: table is read-only: a new reading is code in those places, not an entry here
LAYOUT_CHOICE_HELP: Mapping[LayoutChoice, str] = MappingProxyType(
    {
        "auto": "infers it, and warns when another reading is as plausible",
        "columns": "(x_list, y_list), a dict of columns",
        "records": "each appended pickle, or each item of a top-level list, is one sample",
        "file": "one sample per file",
    }
)
LAYOUT_CHOICES: tuple[LayoutChoice, ...] = tuple(LAYOUT_CHOICE_HELP)


def check_layout_choice(layout: str) -> LayoutChoice:
    """``layout`` if it is one of :data:`LAYOUT_CHOICES`, else ``ValueError`` listing them."""
    if layout not in LAYOUT_CHOICES:
        raise ValueError(
            f"layout must be one of {', '.join(map(repr, LAYOUT_CHOICES))}, got {layout!r}"
        )
    return layout


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
# layout="records" only: a top-level list whose items are the samples, each the single field x
ITEMS = Layout("items", ("list",), "item", keyed=False)
# Read-only: match_layout decides among these rows by name, so a row added from outside would
# never be chosen (a new layout is a row here and a decision in match_layout).
LAYOUT_TABLE: Mapping[str, Layout] = MappingProxyType(
    {x.name: x for x in (COLUMNS, DICT_COLUMNS, ROWS, DICT_ROWS, SAMPLES, DICT_SAMPLES, ITEMS)}
)
# the layouts "auto" infers for a file of one pickle
LAYOUTS = tuple(n for n, x in LAYOUT_TABLE.items() if not x.per_pickle and x is not ITEMS)


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
    top: str,
    items: Sequence[T],
    kind: Callable[[T], str],
    size: Callable[[T], int],
    choice: LayoutChoice = "auto",
) -> Layout:
    """The layout of a top-level object of container kind ``top`` (``"tuple"``, ``"list"``,
    ``"dict"``) whose items (a dict's values) are ``items``: the one set of decisions that both
    :func:`decode_layout` (on the unpickled object) and the scanner (on the opcode walker's
    nodes, :mod:`pickleshard.scan.matching`) make. ``kind(x)`` is ``"tuple"``, ``"list"``,
    ``"dict"``, ``"array"``, ``"unknown"`` or ``"other"``; ``size(x)`` is a container's length.
    A field may be anything but a dict or an ``"other"`` value; whether an ``"unknown"`` one
    really is a field is the caller's to check. Raises :class:`NoLayout` with the reason.

    ``choice`` (see :data:`LAYOUT_CHOICES`) narrows the decision: ``"columns"`` gives a column
    layout or none, ``"records"`` (a top-level list) the rows, dict rows or items it holds.
    """
    if top not in ("tuple", "list", "dict") or not items:
        raise NoLayout("the top-level object is not a non-empty list, tuple or dict")
    fields = all(kind(v) in _FIELD_KINDS for v in items)
    if choice == "records":
        return _records_of(top, items, kind, size)
    if choice == "columns":
        if fields:
            return DICT_COLUMNS if top == "dict" else COLUMNS
        raise NoLayout(f"a top-level {top} whose items are not all sequences (layout='columns')")
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
        if not size(items[0]):  # as an empty tuple, an empty dict is no row of fields
            raise NoLayout("a list whose first item is an empty dict: a row with no fields")
        if all(kind(r) == "dict" for r in items):
            return DICT_ROWS
        raise NoLayout("a list of dicts with some rows of other types")
    if len(items) <= MAX_LIST_FIELDS and fields:
        return COLUMNS
    raise NoLayout(f"a top-level list that is neither rows nor at most {MAX_LIST_FIELDS} columns")


def _records_of(
    top: str, items: Sequence[T], kind: Callable[[T], str], size: Callable[[T], int]
) -> Layout:
    """:func:`match_layout` with ``choice="records"``: each item of a top-level list is one
    sample (per-sample tuples of one length, dicts, or else any objects)."""
    if top != "list":
        raise NoLayout(f"layout='records' reads the items of a top-level list, not a {top}")
    first = kind(items[0])
    if first == "tuple" and size(items[0]):
        if all(kind(r) == "tuple" and size(r) == size(items[0]) for r in items):
            return ROWS
    elif first == "dict" and size(items[0]) and all(kind(r) == "dict" for r in items):
        return DICT_ROWS
    if any(kind(r) == "unknown" for r in items) and first in ("tuple", "dict"):
        raise UnknownRows("a list of per-sample containers with some items of unknown type")
    return ITEMS


# what an unsupported layout's error says a file may hold
EXPECTED_LAYOUTS = (
    "expected (x_list, y_list, ...) as a tuple or list of equal-length sequences, "
    "a dict of equal-length sequences, a list of per-sample tuples, or a list of per-sample dicts"
)

Columns = tuple[Sequence[Any], ...]


@dataclass(frozen=True)
class DecodedLayout:
    """A decoded file: its layout name, field names and columns; ``metadata`` holds a
    one-pickle dict's scalar values by name (:mod:`pickleshard.scan.filemeta`), and
    ``ambiguity`` the other plausible reading where ``layout="auto"`` had a choice."""

    layout: str
    fields: tuple[str, ...]
    columns: Columns
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)
    ambiguity: Ambiguity | None = field(default=None, compare=False)

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


def _dict_items(
    obj: dict[Any, Any], where: str, metadata: bool
) -> tuple[tuple[Any, ...], list[Any], dict[str, Any]]:
    """A top-level dict's field keys, field values and (with ``metadata``) metadata by name;
    :class:`UnsupportedLayoutError` naming the first key whose value is neither."""
    keys, values, meta = [], [], {}
    for k, v in obj.items():
        if _kind(v) in _FIELD_KINDS:
            keys.append(k)
            values.append(v)
        elif metadata and is_metadata(v):
            meta[field_name(k)] = v
        else:
            what = (
                "a small scalar, kept as file metadata only in a file of one pickle"
                if is_metadata(v)
                else "neither a column (list, tuple, numpy array) nor a small scalar kept as "
                "file metadata"
            )
            raise UnsupportedLayoutError(
                where,
                f"top-level dict whose value for key {k!r} is {_describe(v)}: {what}; {EXPECTED_LAYOUTS}",
            )
    return tuple(keys), values, meta


def field_names(keys: Sequence[Any], where: str) -> tuple[str, ...]:
    """The field names of dict keys (:func:`~pickleshard.scan.filemeta.field_name`);
    :class:`UnsupportedLayoutError` when two keys give one name (``"x"`` and ``b"x"``)."""
    names = tuple(field_name(k) for k in keys)
    if len(set(names)) < len(names):
        raise UnsupportedLayoutError(where, f"dict keys {list(keys)} name the same field twice")
    return names


def decode_layout(
    obj: object,
    path: str | os.PathLike[str],
    *,
    choice: LayoutChoice = "auto",
    metadata: bool = False,
) -> DecodedLayout:
    """Recognise the layout of an unpickled top-level object and return it as columns.

    ``choice`` narrows the decision as in :func:`match_layout`. With ``metadata`` (a file of
    one pickle), a top-level dict's small scalar values are the file's metadata
    (:attr:`DecodedLayout.metadata`), its other values the columns.

    Raises :class:`UnsupportedLayoutError` (naming ``path``) for anything else, and
    :class:`FieldLengthMismatchError` when the fields of a columns layout differ in length.
    """
    where = os.fspath(path)
    top = _kind(obj)
    items: Sequence[Any] = ()
    meta: dict[str, Any] = {}
    keys: tuple[Any, ...] = ()
    if top == "dict":
        keys, items, meta = _dict_items(cast(dict[Any, Any], obj), where, metadata)
    elif top in ("tuple", "list"):
        items = cast(Sequence[Any], obj)
    try:
        layout = match_layout(top, items, _kind, len, choice)
    except NoLayout as exc:
        if top == "dict" and not items and obj:
            raise UnsupportedLayoutError(
                where, f"top-level dict with no sequence values; {EXPECTED_LAYOUTS}"
            ) from None
        raise UnsupportedLayoutError(
            where, f"top-level object is {_describe(obj)} ({exc}); {EXPECTED_LAYOUTS}"
        ) from None
    if not layout.per_sample:
        fields = field_names(keys, where) if layout.keyed else default_field_names(len(items))
        columns = tuple(items)
        _check_lengths(where, fields, columns)
        return DecodedLayout(layout.name, fields, columns, meta)
    if layout.sample == "item":
        return DecodedLayout(layout.name, ("x",), (list(items),))
    if layout.sample == "tuple":
        fields = default_field_names(len(items[0]))
        return DecodedLayout(layout.name, fields, tuple(zip(*items, strict=True)))
    keys = tuple(items[0])
    differ = _differing_key(keys, items)
    if differ is not None:
        if choice == "records":  # each dict one sample, as it is: no key dropped or missed
            return DecodedLayout(ITEMS.name, ("x",), (list(items),))
        raise UnsupportedLayoutError(
            where, f"per-sample dicts with different keys ({differ}); {EXPECTED_LAYOUTS}"
        )
    columns = tuple([r[k] for r in items] for k in keys)
    return DecodedLayout(layout.name, field_names(keys, where), columns)


def _differing_key(keys: tuple[Any, ...], rows: Sequence[Any]) -> str | None:
    """How the first of ``rows`` whose keys are not ``keys`` differs (``missing 'k'`` /
    ``extra 'k'``), or None when every row has exactly those keys."""
    for r in rows:
        missing = next((k for k in keys if k not in r), _NONE)
        if missing is not _NONE:
            return f"missing {missing!r}"
        if len(r) != len(keys):
            return f"extra {next(k for k in r if k not in keys)!r}"
    return None


_NONE = object()
