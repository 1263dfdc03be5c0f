"""Decoding every pickle of a file into samples: one pickle by its layout, several appended ones
as chunks or as one sample each, as the ``layout=`` the user chose says (the rules are in
:mod:`pickleshard.scan.layouts`), and where ``layout="auto"`` had a choice, the other reading
(:mod:`pickleshard.scan.ambiguity`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np

from ..errors import UnsupportedLayoutError
from .ambiguity import Ambiguity, judge
from .defaults import (
    FieldFacts,
    appended_are_records,
    facts_of_object,
    judge_one_sample,
    one_pickle_is_one_sample,
)
from .layouts import (
    APPENDED,
    DICT_SAMPLES,
    EXPECTED_LAYOUTS,
    LAYOUT_TABLE,
    SAMPLES,
    Columns,
    DecodedLayout,
    LayoutChoice,
    decode_layout,
    default_field_names,
    field_names,
)

__all__ = ["decode_records", "judge_chunks"]


def _concat(parts: Sequence[Sequence[Any]]) -> Sequence[Any]:
    """One column from its chunks: arrays of one dtype and row shape stay an array."""
    if all(isinstance(p, np.ndarray) for p in parts):
        arrays: list[np.ndarray] = list(parts)  # type: ignore[arg-type]
        first = arrays[0]
        if all(a.dtype == first.dtype and a.shape[1:] == first.shape[1:] for a in arrays):
            return cast(Sequence[Any], np.concatenate(arrays))
    return list(itertools.chain.from_iterable(parts))


def _one_per_record(objs: Sequence[Any], where: str, prefix: str = APPENDED) -> DecodedLayout:
    first = objs[0]
    if type(first) is tuple and first:
        if not all(type(o) is tuple and len(o) == len(first) for o in objs):
            raise UnsupportedLayoutError(
                where, "appended pickles are samples of different shapes (tuples of one length)"
            )
        fields = default_field_names(len(first))
        return DecodedLayout(prefix + SAMPLES.name, fields, tuple(zip(*objs, strict=True)))
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
        return DecodedLayout(prefix + DICT_SAMPLES.name, field_names(keys, where), columns)
    return DecodedLayout(prefix + SAMPLES.name, ("x",), (list(objs),))


def _chunk_facts(chunk: DecodedLayout) -> list[FieldFacts]:
    """The facts of one appended pickle read as columns (:mod:`pickleshard.scan.defaults`)."""
    return [
        FieldFacts("array", len(c), c.ndim)
        if isinstance(c, np.ndarray)
        else FieldFacts("sequence", len(c), 1)
        for c in chunk.columns
    ]


def _elements(fields: Sequence[str], columns: Columns) -> str:
    """The fields' element types in words: ``x (32, 3) uint8, y list``."""
    out = []
    for f, col in zip(fields, columns, strict=True):
        if isinstance(col, np.ndarray):
            out.append(f"{f} {tuple(col.shape[1:])} {col.dtype}")
        else:
            out.append(f"{f} {type(col[0]).__name__ if len(col) else 'empty'}")
    return ", ".join(out)


def judge_chunks(
    layout: str, fields: tuple[str, ...], chunks: Sequence[DecodedLayout]
) -> Ambiguity | None:
    """:func:`~pickleshard.scan.ambiguity.judge` of a file read as ``layout`` with ``fields``,
    from the facts of the pickles it was decoded from (``chunks``, one each)."""
    first = chunks[0].columns
    return judge(
        LAYOUT_TABLE.get(layout.removeprefix(APPENDED)),
        [c.num_samples for c in chunks],
        [all(isinstance(col, np.ndarray) for col in c.columns) for c in chunks],
        deep=all(isinstance(col, np.ndarray) and col.ndim >= 2 for col in first),
        width=len(fields),
        elements=_elements(fields, first),
    )


def _judged(result: DecodedLayout, chunks: Sequence[DecodedLayout]) -> DecodedLayout:
    found = judge_chunks(result.layout, result.fields, chunks)
    return result if found is None else replace(result, ambiguity=found)


def decode_records(
    objs: Sequence[Any], path: str | os.PathLike[str], layout: LayoutChoice = "auto"
) -> DecodedLayout:
    """Samples of a file holding the pickles ``objs`` (one per ``pickle.dump`` call), read as
    ``layout`` (:data:`LAYOUT_CHOICES`) says.

    ``"auto"``: one pickle is one sample where :mod:`pickleshard.scan.defaults` says so, else
    :func:`decode_layout` (its dict's scalars are metadata). Several are chunks when every one
    is a layout with the same fields (layout ``appended_<layout of the first>``, samples in file
    order) and :mod:`~pickleshard.scan.defaults` does not call them records, and otherwise one
    sample each (see the module docstring); the result's ``ambiguity`` says when the other reading is as
    plausible. ``"columns"``: every pickle is a column layout, else
    :class:`UnsupportedLayoutError`. ``"records"``: one sample per pickle, or the items of a
    single pickle's top-level list. ``"file"``: the one pickle is one sample.
    """
    where = os.fspath(path)
    if not objs:
        raise UnsupportedLayoutError(where, f"the file holds no pickle; {EXPECTED_LAYOUTS}")
    if layout == "file":
        if len(objs) > 1:
            raise UnsupportedLayoutError(
                where,
                f"layout='file' reads a file of one pickle as one sample, but this file holds "
                f"{len(objs)} (one per pickle.dump call); layout='records' reads one sample "
                "per pickle",
            )
        return _one_per_record(objs, where, "")
    if layout == "records":
        if len(objs) == 1 and type(objs[0]) is list and objs[0]:
            return decode_layout(objs[0], where, choice="records")
        return _one_per_record(objs, where, APPENDED if len(objs) > 1 else "")
    if len(objs) == 1:
        found = facts_of_object(objs[0]) if layout == "auto" else None
        if found is not None and one_pickle_is_one_sample(*found):
            whole = _one_per_record(objs, where, "")
            return replace(whole, ambiguity=judge_one_sample(found[0]))
        try:
            single = decode_layout(objs[0], where, choice=layout, metadata=True)
        except UnsupportedLayoutError as exc:  # FieldLengthMismatchError too: (obs, action)
            if layout != "auto":
                raise
            # a list that is no layout is most often a list of samples (custom objects)
            fix = (
                "if each item of the list is one sample, layout='records' reads them"
                if type(objs[0]) is list and objs[0]
                else "if the file holds one sample, layout='file' reads it whole"
            )
            err = type(exc)(f"{exc}; {fix}")
            err.path = exc.path
            raise err from None
        return _judged(single, [single]) if layout == "auto" else single
    try:
        chunks = [decode_layout(o, where, choice=layout) for o in objs]
    except UnsupportedLayoutError:
        if layout == "columns":
            raise
        return _one_per_record(objs, where)
    first = chunks[0]
    for r, chunk in enumerate(chunks[1:], start=2):
        if chunk.fields != first.fields:
            raise UnsupportedLayoutError(
                where,
                f"appended pickle #{r} has fields {list(chunk.fields)}, "
                f"the first {list(first.fields)}",
            )
    if layout == "auto" and appended_are_records([_chunk_facts(c) for c in chunks]):
        return _one_per_record(objs, where)
    columns = tuple(_concat([c.columns[f] for c in chunks]) for f in range(len(first.fields)))
    result = DecodedLayout(APPENDED + first.layout, first.fields, columns)
    return _judged(result, chunks) if layout == "auto" else result
