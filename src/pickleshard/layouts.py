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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import FieldLengthMismatchError, UnsupportedLayoutError

__all__ = ["LAYOUTS", "Columns", "DecodedLayout", "decode_layout", "default_field_names"]

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
