"""What ``layout="auto"`` reads a pickle as where its bytes allow a column reading and a
one-sample reading: rules over facts the scanner and a whole-file load both know.

A pickle whose top-level object is a dict or a tuple may be *columns* (sample ``i`` is row ``i``
of every value) or *one sample* (the whole object). The rules, each from the facts of the
pickle's top-level values (:class:`FieldFacts`: a numpy array with its first dimension and number
of dimensions, a list or tuple with its length, or anything else):

- **A file of one pickle** (:func:`one_pickle_is_one_sample`) is one sample when

  - some values are sequences (numpy arrays, lists, tuples) and some are not (scalars, a
    nested dict...), unless it is a dict whose sequences are two or more columns of one
    length: then its small scalars are the file's metadata (CIFAR's ``batch_label`` beside ``data`` and ``labels``,
    :mod:`pickleshard.scan.filemeta`). So ``{"image": array(32, 32, 3), "label": 3}`` is one
    sample and keeps ``label``: a scalar never silently leaves the samples;
  - every value is a numpy array and their first dimensions differ (``(image (32, 32, 3),
    mask (16, 16))``): they cannot be columns;
  - two or more values, every one a numpy array of two dimensions or more, all of one first
    dimension of at most :data:`~pickleshard.scan.ambiguity.FEW_ROWS` (``(image, mask)``): no value holds one scalar per sample,
    as a label column does, so the first dimension is as likely a spatial size. Both readings
    stay plausible, so this one warns (:func:`judge_one_sample`).

- **Appended pickles, each read as columns of the same fields** (:func:`appended_are_records`)
  are records, one sample per pickle, when every value of every pickle is a numpy array, all of
  one first dimension of at most ``FEW_ROWS``, the same in every pickle, and no pickle pairs a
  one-dimensional array with arrays of more (a label column beside the data, the mark of
  chunks of ``(X, y)``): RL transitions ``{"obs": array(8), "next_obs": array(8)}`` and
  ``(image (32, 32, 3), mask (32, 32))`` records. Chunks that differ in length or carry a label
  column stay columns, and warn (:func:`pickleshard.scan.ambiguity.judge`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .ambiguity import FEW_ROWS, Ambiguity

__all__ = [
    "FieldFacts",
    "appended_are_records",
    "facts_of_object",
    "judge_one_sample",
    "one_pickle_is_one_sample",
]

FactKind = Literal["array", "sequence", "other"]


@dataclass(frozen=True)
class FieldFacts:
    """What the rules read of one top-level value of a pickle: ``kind`` is ``"array"`` (a numpy
    array of one dimension or more), ``"sequence"`` (a list or tuple) or ``"other"``; ``rows``
    its first dimension or length (0 for other); ``ndim`` its number of dimensions (1 for a
    sequence, 0 for other)."""

    kind: FactKind
    rows: int = 0
    ndim: int = 0

    @property
    def column(self) -> bool:
        return self.kind != "other"


def facts_of_object(obj: object) -> tuple[tuple[FieldFacts, ...], bool] | None:
    """The facts of an unpickled top-level object's values and whether it is keyed (a dict);
    None unless it is an exact dict or tuple (what the scanner sees as one)."""
    if type(obj) is dict:
        values: Sequence[Any] = list(obj.values())
    elif type(obj) is tuple:
        values = obj
    else:
        return None
    return tuple(_facts_of_value(v) for v in values), type(obj) is dict


def _facts_of_value(v: object) -> FieldFacts:
    if isinstance(v, np.ndarray) and v.ndim >= 1:
        return FieldFacts("array", int(v.shape[0]), v.ndim)
    if isinstance(v, (list, tuple)):
        return FieldFacts("sequence", len(v), 1)
    return FieldFacts("other")


def _deep_few(fields: Sequence[FieldFacts]) -> bool:
    """Two or more values, every one a numpy array of two dimensions or more, all of one first
    dimension of at least 1 and at most ``FEW_ROWS``: rows of such arrays are as likely parts
    of one sample (a lone array stays columns, and :func:`~pickleshard.scan.ambiguity.judge`
    warns)."""
    rows = {f.rows for f in fields}
    return (
        len(fields) >= 2
        and all(f.kind == "array" and f.ndim >= 2 for f in fields)
        and len(rows) == 1
        and 1 <= min(rows) <= FEW_ROWS
    )


def one_pickle_is_one_sample(fields: Sequence[FieldFacts], keyed: bool) -> bool:
    """Whether the one pickle of a file, a dict (``keyed``) or tuple whose values have the
    facts ``fields``, is read as one sample rather than as columns (see the module docstring)."""
    if not fields:
        return False
    columns = [f for f in fields if f.column]
    if not columns:  # a dict of settings, not a sample of data: refused as no layout
        return False
    one_length = len({f.rows for f in columns}) == 1
    if len(columns) < len(fields):
        return not (keyed and len(columns) >= 2 and one_length)
    if all(f.kind == "array" for f in fields) and not one_length:
        return True
    return _deep_few(fields)


def judge_one_sample(fields: Sequence[FieldFacts]) -> Ambiguity | None:
    """The other plausible reading of a file read as one sample by
    :func:`one_pickle_is_one_sample`: columns, where its values are arrays that may be rows of
    a few samples; None when columns are not plausible."""
    if not _deep_few(fields):
        return None
    n = fields[0].rows
    return Ambiguity(
        chosen="one sample per file (the whole object)",
        alternative=f"columns of numpy arrays, {n} samples (one row of each)",
        argument="columns",
        keep="file",
    )


def appended_are_records(pickles: Sequence[Sequence[FieldFacts]]) -> bool:
    """Whether appended pickles, each read as columns with the facts ``pickles[r]``, are read
    as one sample per pickle instead (see the module docstring)."""
    if len(pickles) < 2 or not all(p and all(f.kind == "array" for f in p) for p in pickles):
        return False
    rows = {f.rows for p in pickles for f in p}
    if len(rows) != 1 or not 1 <= min(rows) <= FEW_ROWS:
        return False
    ndims = {f.ndim for f in pickles[0]}
    return not (1 in ndims and max(ndims) >= 2)  # a label column beside the data: chunks
