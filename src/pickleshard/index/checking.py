"""What every check of an untrusted index shares: the violation it raises, and typed readers of
the values of ``index.json`` (``bool`` is not an int, a count is not a string)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import IndexFormatError

__all__ = [
    "INT",
    "ITEM",
    "MAX_ID",
    "PICKLE",
    "ROW",
    "FieldCheck",
    "IndexProblem",
    "show",
    "want_dict",
    "want_int",
    "want_list",
    "want_str",
]

MAX_ID = 1 << 62  # any count or offset of a real index is far below this
PICKLE, ROW, INT, ITEM = range(4)  # how a (file, field) is read, as the readers decide


class IndexProblem(Exception):
    """One violation: ``where`` names the index file, ``what`` says what is wrong."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(what)
        self.where, self.what = where, what

    def error(self, index_dir: Path) -> IndexFormatError:
        """The :class:`IndexFormatError` to raise for the index in ``index_dir``."""
        return IndexFormatError(
            index_dir / self.where,
            f"{self.what} (a damaged or edited index: rebuild it with `pickleshard index` or "
            "rebuild='auto')",
        )


@dataclass(frozen=True)
class FieldCheck:
    """What the span lengths of one field of one file must agree with, from its descriptor:
    ``how`` it is read (``PICKLE``, ``ROW``, ``INT``, ``ITEM``); ``nbytes`` of a row (``ROW``) or
    of a payload (``ITEM``); an item's ``prefix``, ``exceptions`` and the length of its
    template's ``tail`` (-1 when none is stored)."""

    how: int
    nbytes: int = 0
    prefix: int = 0
    tail: int = -1
    exceptions: tuple[int, ...] = ()


def show(v: Any) -> str:
    """``repr(v)``, cut to 60 characters."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def want_int(v: Any, what: str, lo: int = 0, hi: int = MAX_ID, *, none: bool = False) -> Any:
    """``v`` if it is an int (not a bool) in ``[lo, hi]`` (or None, with ``none``); else raise
    an :class:`IndexProblem` of ``index.json`` saying ``what`` it is."""
    if v is None and none:
        return None
    if type(v) is not int or not lo <= v <= hi:
        raise IndexProblem(
            "index.json", f"{what} is {show(v)}, expected an integer in [{lo}, {hi}]"
        )
    return v


def want_str(v: Any, what: str, *, none: bool = False) -> Any:
    """``v`` if it is a string (or None, with ``none``); else raise an :class:`IndexProblem`."""
    if (v is None and none) or type(v) is str:
        return v
    raise IndexProblem("index.json", f"{what} is {show(v)}, expected a string")


def want_list(v: Any, what: str, n: int | None = None) -> list[Any]:
    """``v`` if it is a list (of ``n`` items, when given); else raise an :class:`IndexProblem`."""
    if type(v) is not list or (n is not None and len(v) != n):
        want = "a list" if n is None else f"a list of {n}"
        raise IndexProblem("index.json", f"{what} is {show(v)}, expected {want}")
    return v


def want_dict(v: Any, what: str) -> dict[str, Any]:
    """``v`` if it is a JSON object; else raise an :class:`IndexProblem`."""
    if type(v) is not dict:
        raise IndexProblem("index.json", f"{what} is {show(v)}, expected an object")
    return v
