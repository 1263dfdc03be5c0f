"""The row pass: a file that is one list of flat rows, walked without a node per value.

The commonest file of Python objects is ``pickle.dump([row, row, ...])``, each row a dict with
the same keys or a tuple of one length, holding scalars, strings and lists of those. The general
walk (:func:`pickleshard.picklekit.walk.walk_opcodes`) builds a node per container and an offset
object per value for it, and :mod:`pickleshard.scan.matching` reads them back row by row: most of
a scan's time on such a file. The compiled row pass (``_cscan.walk_rows``) steps the same opcodes
and keeps, in int64 arrays, only what the result is made of: each row's item spans (those
:func:`~pickleshard.scan.matching.spans` gives from the row nodes) and the walk's memo facts.

:func:`walk_rows` answers None for anything else (any global, a nested dict, a GET of a
container, appended pickles, protocol 0-1, a damaged file): the general walk then walks the
file and gives the answer or the error. The row pass never decides a refusal or an error itself,
so the two can only differ in speed; the twin tests compare them.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from ..picklekit.compiled import CORE
from ..picklekit.nodes import DICT
from ..picklekit.opcodes import HIGHEST_PROTOCOL, PROTO_OP
from ..picklekit.walk import releaser, resolve_engine
from ..picklekit.walker import Walked
from .layouts import DICT_ROWS, ROWS, LayoutChoice
from .matching import Candidate, RowSpans

__all__ = ["walk_rows"]


def walk_rows(
    buf: Any, size: int, name: str, engine: str, layout: LayoutChoice, release: bool = True
) -> tuple[Walked, Candidate] | None:
    """The walk of ``buf[:size]`` and its one candidate (layout ``rows`` or ``dict_rows``) when
    the file is one pickle of a list of flat rows and the compiled core runs; else None.
    ``release``: as :func:`~pickleshard.picklekit.walk.walk_opcodes`'s."""
    if (
        CORE is None
        or layout not in ("auto", "records")
        or resolve_engine(engine) != "compiled"
        or size < 3
        or buf[0] != PROTO_OP
        or not 2 <= buf[1] <= HIGHEST_PROTOCOL
    ):
        return None
    w = Walked(name, size, buf[1], [], [], array("q"), array("q"), array("q"), 0, "compiled")
    got = CORE.walk_rows(buf, 2, size, w, releaser(buf) if release else None)
    if got is None:
        return None
    kind, row_ends, sizes, starts, ends, nxt, first_id = got
    if nxt != size or not len(starts) or min(sizes) != max(sizes):
        # appended pickles, rows with no fields (empty dicts) or of different sizes: the
        # general walk reads them all, and says what is wrong
        return None
    w.records.append((0, nxt, -first_id))

    def i64(a: array[int]) -> np.ndarray:
        return np.frombuffer(a, np.int64) if len(a) else np.zeros(0, np.int64)

    flat = RowSpans(i64(starts), i64(ends), i64(sizes))
    cand = Candidate(DICT_ROWS if kind == DICT else ROWS, [], list(row_ends), [], "list", rows=flat)
    return w, cand
