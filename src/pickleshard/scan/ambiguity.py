"""When the inferred layout is not the only plausible reading of a file: the rule, and the words.

``layout="auto"`` infers how samples sit in a file (:mod:`pickleshard.scan.layouts`). Some
files have two legal readings, and taking one silently is wrong half the time: 400
``pickle.dump((image_32x32x3, mask_32x32), f)`` records read as columns are 12,800 samples of
``((32, 3), (32,))`` rows. The rule (:func:`judge`) looks only at facts both the scanner and a
whole-file load know, so both flag the same files:

- **Appended pickles read as column chunks of numpy arrays, each only a few samples long**:
  every field of every pickle is a numpy array and every pickle has at most :data:`FEW_ROWS`
  samples. The "samples" are then rows of arrays whose first dimension is as likely a spatial
  size or a vector's length (a per-record first dimension) as a sample count. The other reading
  is one sample per pickle: ``layout="records"``.
- **One pickle read as columns that are all numpy arrays of two dimensions or more, with at
  most** :data:`FEW_ROWS` **samples**: no column holds one scalar per sample (a dataset's label
  column does), so the "columns" may be the parts of one sample (an ``(image, mask)``), their
  shared length a spatial size. The other reading is one sample per file: ``layout="file"``.
- **One top-level list of N per-sample tuples of W items, W above both N and**
  :data:`FEW_ROWS`: so wide a "sample" is more likely N columns. The other reading is
  ``layout="columns"``.

The seed's ``(x_list, y_list)`` (list fields), an ``(X, y)`` with a label column, and chunked
writes of many samples never match. :class:`Ambiguity` says what was chosen and what else it may be; it travels in the index's
files table as JSON, so that opening the dataset warns (once) without rescanning.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

__all__ = ["FEW_ROWS", "Ambiguity", "AmbiguousLayoutWarning", "judge", "warn_ambiguous"]

FEW_ROWS = 64
"""At most this many samples in a pickle read as columns is "a few": a per-sample record's
arrays are this short along their first dimension (a spatial size, a vector's length)."""

_MAX_LIST_FIELDS = 64  # as pickleshard.scan.layouts.MAX_LIST_FIELDS


class AmbiguousLayoutWarning(UserWarning):
    """A file's layout was inferred (``layout="auto"``) where another reading of the same bytes
    is as plausible; the message names the file, both readings and the ``layout=`` argument
    that picks each (which also silences it). Not an error: the data is read as stated."""


@dataclass(frozen=True)
class Ambiguity:
    """What ``layout="auto"`` read a file as (``chosen``, in words) and the other plausible
    reading (``alternative``); ``argument`` is the ``layout=`` value that picks the alternative
    and ``keep`` the one that keeps this reading, each silencing the warning."""

    chosen: str
    alternative: str
    argument: str
    keep: str

    def message(self, path: str | os.PathLike[str]) -> str:
        return (
            f"{os.fspath(path)}: layout inferred as {self.chosen}; it may equally be "
            f"{self.alternative}. Pass layout={self.argument!r} for that reading, or "
            f"layout={self.keep!r} to keep this one (either silences this warning)"
        )

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> Ambiguity:
        """The stored form back; ``ValueError`` for anything :meth:`to_json` could not write."""
        keys = ("chosen", "alternative", "argument", "keep")
        if not isinstance(obj, dict) or set(obj) != set(keys):
            raise ValueError("ambiguity is not an object of chosen/alternative/argument/keep")
        if not all(type(obj[k]) is str for k in keys):
            raise ValueError("ambiguity holds a value that is not a string")
        if obj["argument"] not in ("columns", "records", "file") or obj["keep"] not in (
            "columns",
            "records",
            "file",
        ):
            raise ValueError("ambiguity names an unknown layout")
        return cls(**{k: obj[k] for k in keys})


class LayoutFacts(Protocol):
    """What :func:`judge` reads of a layout (a :class:`~pickleshard.scan.layouts.Layout`)."""

    @property
    def per_sample(self) -> bool: ...
    @property
    def rows(self) -> bool: ...
    @property
    def sample(self) -> str: ...


def judge(
    entry: LayoutFacts | None,
    rows: Sequence[int],
    arrays: Sequence[bool],
    *,
    deep: bool = False,
    width: int = 0,
    elements: str = "",
) -> Ambiguity | None:
    """The ambiguity of a file ``layout="auto"`` read as the layout ``entry`` (its
    :data:`~pickleshard.scan.layouts.LAYOUT_TABLE` row; None: no judgement), or None when its reading is the only plausible one (see the module
    docstring). ``rows``: the samples of each pickle of the file; ``arrays``: whether every
    field of that pickle is a numpy array; ``deep``: every field of the first pickle has
    elements of one dimension or more; ``width``: the fields per sample; ``elements``: the
    fields' element types in words, for the message."""
    if entry is None or not rows:
        return None
    what = f" ({elements})" if elements else ""
    total = sum(rows)
    if not entry.per_sample:
        if len(rows) > 1 and max(rows) <= FEW_ROWS and all(arrays):
            each = f"{rows[0]}" if len(set(rows)) == 1 else f"at most {max(rows)}"
            return Ambiguity(
                chosen=f"{len(rows)} appended pickles each of columns {each} samples long, "
                f"{total} samples{what}",
                alternative=f"{len(rows)} records, one sample per pickle",
                argument="records",
                keep="columns",
            )
        if len(rows) == 1 and arrays[0] and deep and rows[0] <= FEW_ROWS:
            return Ambiguity(
                chosen=f"columns of numpy arrays, {rows[0]} samples (one row of each){what}",
                alternative="one sample per file (the whole object)",
                argument="file",
                keep="columns",
            )
        return None
    rows_of_tuples = entry.rows and entry.sample == "tuple" and len(rows) == 1
    if rows_of_tuples and rows[0] <= _MAX_LIST_FIELDS and width > max(rows[0], FEW_ROWS):
        return Ambiguity(
            chosen=f"a list of {rows[0]} per-sample tuples of {width} items",
            alternative=f"{rows[0]} columns of {width} samples each",
            argument="columns",
            keep="records",
        )
    return None


def warn_ambiguous(found: Iterable[tuple[str, dict[str, str] | None]], stacklevel: int = 2) -> None:
    """One :class:`~pickleshard.AmbiguousLayoutWarning` for the ``(path, stored
    ambiguity)`` pairs of a dataset's files (as the files table keeps them), naming the first
    ambiguous file and how many there are; nothing when none is."""
    hits = [(path, Ambiguity.from_json(a)) for path, a in found if a is not None]
    if not hits:
        return
    path, first = hits[0]
    more = f" ({len(hits) - 1} more file(s) likewise)" if len(hits) > 1 else ""
    warnings.warn(first.message(path) + more, AmbiguousLayoutWarning, stacklevel=stacklevel + 1)
