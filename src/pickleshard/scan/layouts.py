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
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ..errors import FieldLengthMismatchError, UnsupportedLayoutError

__all__ = [
    "LAYOUTS",
    "Columns",
    "DecodedLayout",
    "decode_layout",
    "decode_records",
    "default_field_names",
]

# A top-level *list* of sequences is read as columns only up to this many fields; longer lists
# of lists are far more likely per-sample rows, and guessing wrong would be silent.
MAX_LIST_FIELDS = 64
LAYOUTS = ("columns", "dict_columns", "rows", "dict_rows")
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


def _is_field(obj: object) -> bool:
    if isinstance(obj, np.ndarray):
        return obj.ndim >= 1
    return isinstance(obj, (list, tuple))


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
    if isinstance(obj, dict):
        if obj and all(_is_field(v) for v in obj.values()):
            fields = tuple(str(k) for k in obj)
            columns = tuple(obj.values())
            _check_lengths(where, fields, columns)
            return DecodedLayout("dict_columns", fields, columns)
        raise UnsupportedLayoutError(
            where, f"top-level dict whose values are not all sequences; {_EXPECTED}"
        )
    if isinstance(obj, tuple) and obj and all(_is_field(v) for v in obj):
        fields = default_field_names(len(obj))
        _check_lengths(where, fields, obj)
        return DecodedLayout("columns", fields, obj)
    if isinstance(obj, list) and obj:
        first = obj[0]
        if (
            isinstance(first, tuple)
            and first
            and all(isinstance(r, tuple) and len(r) == len(first) for r in obj)
        ):
            fields = default_field_names(len(first))
            return DecodedLayout("rows", fields, tuple(zip(*obj, strict=True)))
        if isinstance(first, dict) and all(isinstance(r, dict) for r in obj):
            keys = tuple(first)
            fields = tuple(str(k) for k in keys)
            try:
                columns = tuple([r[k] for r in obj] for k in keys)
            except KeyError as exc:
                raise UnsupportedLayoutError(
                    where, f"per-sample dicts with different keys (missing {exc}); {_EXPECTED}"
                ) from None
            return DecodedLayout("dict_rows", fields, columns)
        if len(obj) <= MAX_LIST_FIELDS and all(_is_field(v) for v in obj):
            fields = default_field_names(len(obj))
            _check_lengths(where, fields, tuple(obj))
            return DecodedLayout("columns", fields, tuple(obj))
    raise UnsupportedLayoutError(where, f"top-level object is {_describe(obj)}; {_EXPECTED}")


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
        return DecodedLayout("appended_samples", fields, tuple(zip(*objs, strict=True)))
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
        return DecodedLayout("appended_dict_samples", tuple(str(k) for k in keys), columns)
    return DecodedLayout("appended_samples", ("x",), (list(objs),))


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
    return DecodedLayout(f"appended_{first.layout}", first.fields, columns)
