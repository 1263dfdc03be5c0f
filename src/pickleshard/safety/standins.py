"""What an inert evaluation of a pickle builds instead of running it: stand-ins and placeholders.

:class:`~pickleshard.safety.inert.InspectUnpickler` hands a pickle these in place of what
loading would build:

- :class:`Opaque`: the one stand-in for a global outside the inert allowlist. It remembers its
  name and what it was called with; nothing the file names is imported or run.
- :class:`Payload`: a bulk ``bytes``/``bytearray``/text payload that was skipped (its file
  offset and length), and :class:`EncodedText`: ``_codecs.encode(text, "latin1")``, how
  protocol <= 2 writes bytes.
- :class:`ArraySpec`: a numpy array (dtype, shape, where its bytes are), never allocated.

:class:`Refusals` notes the calls on stand-ins that loading would refuse, by the argument checks
the loader itself runs (:data:`pickleshard.safety.guards.CHECKS`), so ``inspect --strict`` refuses what
loading refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .guards import check_call

__all__ = [
    "MAX_REFUSALS",
    "ArraySpec",
    "EncodedBytes",
    "EncodedText",
    "Opaque",
    "Payload",
    "Refusals",
]

MAX_REFUSALS = 20
"""Refusals a :class:`Refusals` keeps (a hostile file could make millions)."""
GlobalKey = tuple[str, str]


class Refusals:
    """The refusals an inert evaluation found (``texts``, unique, at most ``limit``)."""

    def __init__(self, limit: int = MAX_REFUSALS) -> None:
        self.texts: list[str] = []
        self.limit = limit

    def note(self, text: str) -> None:
        if len(self.texts) < self.limit and text not in self.texts:
            self.texts.append(text)

    def check(self, key: GlobalKey, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Run the loader's argument check of global ``key`` on a call made inertly: skipped
        payloads count as ``str``/``bytes`` of their length."""
        why = check_call(key, tuple(_checked_value(a) for a in args), kwargs)
        if why is not None:
            self.note(f"{'.'.join(key)}: {why}")


class Opaque:
    """The inert stand-in for a global: its ``qualname``, and whether it was called (``made``)
    with which ``args``. Calling it, instantiating it (``NEWOBJ``), giving it state or items all
    yield or ignore stand-ins, so a span that merely *contains* unknown objects can still be
    replayed for the dtypes and strings it defines. A value that *is* a stand-in has an unknown
    type. A stand-in made by :meth:`checked` runs the loader's argument check of its global on
    each call and notes a refusal in its :class:`Refusals`, as loading would refuse it."""

    __slots__ = ("args", "key", "made", "qualname", "sink")
    qualname: str
    args: tuple[Any, ...]
    made: bool
    key: GlobalKey | None
    sink: Refusals | None

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        obj = object.__new__(Opaque)
        obj.key, obj.sink = None, None
        if isinstance(cls, Opaque):  # NEWOBJ: ``cls.__new__(cls, *args)`` on a stand-in class
            obj.qualname, obj.args, obj.made = cls.qualname, args, True
            if cls.sink is not None:
                # the loader hands out a guard, not a class, for a global with an argument check
                cls.sink.note(f"{cls.qualname}: NEWOBJ on a global that a pickle may only call")
        else:
            obj.qualname, obj.args, obj.made = "?", (), False
        return obj

    def __init__(self, qualname: str = "?", args: tuple[Any, ...] = (), made: bool = False):
        self.qualname, self.args, self.made = qualname, args, made

    @classmethod
    def checked(cls, key: GlobalKey, sink: Refusals) -> Opaque:
        """The stand-in for global ``key`` whose calls are checked into ``sink``."""
        stand = cls(".".join(key))
        stand.key, stand.sink = key, sink
        return stand

    def __call__(self, *args: Any, **kwargs: Any) -> Opaque:
        if self.key is not None and self.sink is not None:
            self.sink.check(self.key, args, kwargs)
        return Opaque(self.qualname, args, True)

    def _ignore(self, *args: Any) -> None:
        return None

    __setstate__ = __setitem__ = append = extend = add = _ignore


class Payload(bytes):
    """Stand-in for a payload the inspector skipped: ``length`` bytes at file ``offset``.

    It *is* the payload's bytes when shorter than 4 KiB (dtype metadata, small arrays), and
    empty otherwise; ``kind`` is "bytes", "bytearray", "text", or "string" (a Python 2 ``str``
    read with an encoding that keeps its bytes: ``"bytes"`` or ``"latin1"``).
    """

    offset: int
    length: int
    kind: str

    @classmethod
    def make(cls, data: bytes, offset: int, length: int, kind: str) -> Payload:
        p = cls(data)
        p.offset, p.length, p.kind = offset, length, kind
        return p


class EncodedText:
    """What ``_codecs.encode(text, "latin1")`` stands for: bytes (protocol <= 2), ``length`` of
    them (-1: unknown); numpy's protocol <= 2 array data is one."""

    def __init__(self, length: int) -> None:
        self.length = length


class EncodedBytes(bytes):
    """What ``_codecs.encode(text, "latin1")`` made of a short text: the bytes themselves
    (a dict key, a label), marked as written as latin-1 text (protocol <= 2)."""


class _LenStr(str):
    """A ``str`` of a skipped text payload's length, for the argument checks."""

    length = 0

    def __len__(self) -> int:
        return self.length


class _LenBytes(bytes):
    """``bytes`` of a skipped payload's length, for the argument checks."""

    length = 0

    def __len__(self) -> int:
        return self.length


def _checked_value(v: Any) -> Any:
    """What an inert value stands for, as far as an argument check looks: skipped payloads
    become ``str``/``bytes`` of their length."""
    kind: type[_LenStr] | type[_LenBytes]
    if isinstance(v, Payload):
        kind, n = (_LenStr if v.kind in ("text", "string") else _LenBytes), v.length
    elif isinstance(v, EncodedText) and v.length >= 0:
        kind, n = _LenBytes, v.length
    else:
        return v
    out = kind()
    out.length = n
    return out


@dataclass
class ArraySpec:
    """What an inspected span builds when it is a numpy array; ``problem`` is why its rows
    cannot be read in place (None when they can)."""

    payload: Payload | None = None
    dtype: np.dtype[Any] | None = None
    shape: tuple[int, ...] = ()
    problem: str | None = None
    swap: bool = False  # numpy's __setstate__ byte-swaps a non-native array to native order
    frombuffer: bool = False  # built by numpy's _frombuffer (protocol 5), a view of its payload

    def __setstate__(self, state: Any) -> None:  # BUILD after numpy's _reconstruct
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            self.problem = "unrecognised ndarray state"
            return
        shape, dtype, fortran, data = state[-4:]
        self.describe_data(data, dtype, shape, "F" if fortran else "C")
        self.swap = (
            self.dtype is not None and self.dtype.byteorder in "<>" and not self.dtype.isnative
        )

    def describe_data(self, data: Any, dtype: Any, shape: Any, order: str) -> None:
        """Record the array's ``dtype``, ``shape`` and payload ``data`` (in ``order``), and the
        problem, if any, with reading its rows in place."""
        self.dtype = dtype if isinstance(dtype, np.dtype) else None
        self.shape = tuple(shape) if isinstance(shape, tuple) else ()
        if isinstance(data, (EncodedText, EncodedBytes)):
            self.problem = "its bytes are pickled as latin-1 text (protocol <= 2)"
        elif isinstance(data, Payload) and data.kind == "text":
            self.problem = (
                "its bytes are a Python 2 str decoded as text (encoding='latin1' or 'bytes' "
                "reads them in place)"
            )
        elif isinstance(data, (str, bytes)) and not isinstance(data, Payload):
            self.problem = "its bytes are a short Python 2 str, read with the pickle"
        elif not isinstance(data, Payload) or self.dtype is None:
            self.problem = "it is not a plain array of fixed-size items (object dtype?)"
        elif self.dtype.hasobject:
            self.problem = "its dtype holds Python objects"
        elif order != "C" and len(self.shape) > 1:
            self.problem = f"it is stored in {order!r} order, so a row is not contiguous"
        elif data.length != self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64)):
            self.problem = "its payload size does not match its shape"
        self.payload = data if isinstance(data, Payload) else None
