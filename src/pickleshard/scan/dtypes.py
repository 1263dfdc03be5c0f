"""The one JSON codec for numpy dtypes: an index's array descriptions and a converted dataset's
column descriptors both store a dtype as its ``.npy`` descr.

:func:`dtype_to_json` is :func:`numpy.lib.format.dtype_to_descr`: a string for a plain dtype
(``"<f4"``), a list of field entries for a structured one, each ``[name, descr]`` or
``[name, descr, shape]`` (a sub-array field), where ``name`` is ``[title, name]`` for a field
with a title and ``descr`` may itself be a list (a nested structure). JSON turns the descr's
tuples into lists; :func:`dtype_from_json` turns them back, checking the form as it goes, so that
a stored value that is not a descr is a ``ValueError`` and never a deep recursion or an
arbitrary object handed to numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MAX_DEPTH", "MAX_DIMS", "dtype_from_json", "dtype_to_json"]

MAX_DEPTH = 8  # structures nested deeper are refused when read back (as indexcheck does)
MAX_DIMS = 32  # numpy's own limit on a sub-array's dimensions (NPY_MAXDIMS) in numpy 1.x


def dtype_to_json(dtype: np.dtype[Any]) -> Any:
    """``dtype``'s ``.npy`` descr: a string, or a list of field entries (see the module
    docstring). Byte order, titles, sub-array fields, nesting and padding are kept."""
    return np.lib.format.dtype_to_descr(np.dtype(dtype))


def dtype_from_json(obj: Any) -> np.dtype[Any]:
    """The dtype :func:`dtype_to_json` described, from its JSON round trip (lists for tuples).

    Raises ``ValueError`` naming what is wrong when ``obj`` is not such a descr: a field entry
    of another form, a name that is not text, a shape that is not a list of ints, a structure
    nested deeper than :data:`MAX_DEPTH`, or a string numpy does not read as a dtype.
    """
    descr = _tuples(obj, 0)
    try:
        return np.lib.format.descr_to_dtype(descr)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{obj!r:.200} is not a dtype descr: {exc}") from None


def _tuples(descr: Any, depth: int) -> Any:
    """``descr`` with its field entries, titled names and shapes as tuples again."""
    if type(descr) is str:
        return descr
    if type(descr) is not list:
        raise ValueError(f"a dtype descr is a string or a list of fields, not {descr!r:.200}")
    if depth > MAX_DEPTH:
        raise ValueError(f"a dtype descr nested deeper than {MAX_DEPTH} structures")
    out = []
    for entry in descr:
        if type(entry) not in (list, tuple) or not 2 <= len(entry) <= 3:
            raise ValueError(f"a dtype field entry is [name, descr(, shape)], not {entry!r:.200}")
        name = entry[0]
        if type(name) in (list, tuple):  # [title, name]
            if len(name) != 2 or not all(type(x) is str for x in name):
                raise ValueError(f"a dtype field name is text or [title, name], not {name!r:.200}")
            name = tuple(name)
        elif type(name) is not str:
            raise ValueError(f"a dtype field name is text or [title, name], not {name!r:.200}")
        rest = [_tuples(entry[1], depth + 1)]
        if len(entry) == 3:
            rest.append(_shape(entry[2]))
        out.append((name, *rest))
    return out


def _shape(obj: Any) -> tuple[int, ...]:
    if (
        type(obj) not in (list, tuple)
        or len(obj) > MAX_DIMS
        or not all(type(n) is int and n >= 0 for n in obj)
    ):
        raise ValueError(
            f"a sub-array shape is a list of at most {MAX_DIMS} sizes, not {obj!r:.200}"
        )
    return tuple(obj)
