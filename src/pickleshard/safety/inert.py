"""The inert unpickler: evaluates a span of a pickle without running code or reading bulk payloads.

Both users of an inert evaluation read spans with the one :class:`InspectUnpickler`: the
scanner's inspector (is this field a numpy array, and where are its bytes?) and ``inspect``'s
preview (a type/shape/dtype summary of the first samples, and what loading would refuse). It is a
:class:`~pickleshard.picklekit.unpicklers.SpanUnpickler` whose ``find_class`` consults one inert
allowlist (:data:`INERT_GLOBALS`) and otherwise hands out the one stand-in class,
:class:`~pickleshard.safety.standins.Opaque`; nothing a file names is imported or run.
"""

from __future__ import annotations

import codecs
import copyreg
import pickle
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ..picklekit.hashalike import AlikeInts, hash_flood_message
from ..picklekit.opcodes import I4, U4, U8
from ..picklekit.spanfile import SpanFile
from ..picklekit.unpicklers import SpanUnpickler
from .guards import CHECKS
from .standins import ArraySpec, EncodedBytes, EncodedText, Opaque, Payload, Refusals

__all__ = ["INERT_GLOBALS", "InspectUnpickler", "NotInspectable"]

GlobalKey = tuple[str, str]
_CORES = ("numpy.core", "numpy._core")
_NDARRAY = "numpy.ndarray"
_TEXT_PLACEHOLDER_MIN = 4096


def _is_latin1(encoding: str) -> bool:
    try:
        return codecs.lookup(encoding).name == "iso8859-1"
    except LookupError:
        return False


class NotInspectable(Exception):
    """The span cannot be evaluated (a memo reference that cannot be resolved, bad bytes)."""


class _Evaluator:
    """What ``find_class`` hands out for a global the inert allowlist evaluates: calls go to
    ``fn(key, sink, *args)``; ``BUILD`` on it is ignored (a file may not change the evaluator,
    as the loader refuses ``BUILD`` on a global), and ``NEWOBJ`` on it fails (not a type)."""

    __slots__ = ("_fn", "_key", "_sink")

    def __init__(self, fn: Callable[..., Any], key: GlobalKey, sink: Refusals) -> None:
        self._fn, self._key, self._sink = fn, key, sink

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(self._key, self._sink, *args, **kwargs)

    def __setstate__(self, state: Any) -> None:
        return None


def _frombuffer(
    key: GlobalKey,
    sink: Refusals,
    buf: Any,
    dtype: Any,
    shape: Any,
    order: str,
    axis_order: Any = None,
) -> ArraySpec:
    """numpy's ``_frombuffer`` (protocol 5 arrays), evaluated into an :class:`ArraySpec`."""
    spec = ArraySpec()
    if (
        order == "K"
        and axis_order is not None
        and tuple(axis_order) != tuple(range(len(axis_order)))
    ):
        order = "permuted axes"
    spec.describe_data(buf, dtype, shape, "C" if order == "K" else order)
    spec.frombuffer = True
    return spec


def _reconstruct(
    key: GlobalKey, sink: Refusals, cls: Any, shape: Any = None, typecode: Any = None
) -> Any:
    """numpy's ``_reconstruct`` (protocols <= 4): an :class:`ArraySpec` that the following
    ``BUILD`` describes, when ``cls`` is the stand-in for ``numpy.ndarray``."""
    sink.check(key, (cls, shape, typecode), {})
    if isinstance(cls, Opaque) and cls.qualname == _NDARRAY:
        return ArraySpec()
    return Opaque(f"{key[0]}.{key[1]}", (cls,), True)


def _encode(
    key: GlobalKey, sink: Refusals, text: Any, encoding: str = "utf-8"
) -> EncodedText | bytes:
    """``_codecs.encode`` (how protocol <= 2 writes bytes): the length of what it would make,
    or, for a text read whole (shorter than 4 KiB: a dict key, a label), the bytes themselves."""
    sink.check(key, (text, encoding), {})
    if type(text) is str and _is_latin1(encoding):
        try:
            return EncodedBytes(text.encode("latin1"))
        except UnicodeEncodeError:
            return EncodedText(len(text))
    n = text.length if isinstance(text, Payload) else len(text) if isinstance(text, str) else -1
    return EncodedText(n)


_REAL: dict[GlobalKey, Any] = {("numpy", "dtype"): np.dtype}
for _m in ("builtins", "__builtin__"):
    _REAL[(_m, "range")], _REAL[(_m, "slice")] = range, slice
_EVALUATED: dict[GlobalKey, Callable[..., Any]] = {("_codecs", "encode"): _encode}
for _c in _CORES:
    _EVALUATED[(f"{_c}.numeric", "_frombuffer")] = _frombuffer
    _EVALUATED[(f"{_c}.multiarray", "_reconstruct")] = _reconstruct
INERT_GLOBALS: frozenset[GlobalKey] = frozenset(_REAL) | frozenset(_EVALUATED)
"""The inert allowlist: the globals an inert evaluation knows. numpy's ``dtype`` and the lazy
``range`` and ``slice`` are themselves (so that a container fed a range is seen as loading sees
it); numpy's array reconstruction (1.x ``numpy.core`` and 2.x ``numpy._core`` spellings) and
``_codecs.encode`` are evaluated into :class:`ArraySpec` / :class:`EncodedText`. Every other
global is an :class:`Opaque`, checked by the loader's argument check where it has one
(``numpy.ndarray`` among them: a file cannot call it to allocate)."""


class InspectUnpickler(SpanUnpickler):
    """A :class:`~pickleshard.picklekit.unpicklers.SpanUnpickler` that runs no code and reads no
    bulk payload.

    Globals evaluate as :data:`INERT_GLOBALS` says: numpy's array reconstruction builds
    :class:`ArraySpec` records instead of arrays; any other global is an :class:`Opaque` that
    keeps its name. Calls the
    loader would refuse (the shared argument checks of :mod:`pickleshard.safety.guards`) are noted in
    :attr:`refusals` (``refusals=`` shares one :class:`Refusals` between unpicklers).
    ``bytes`` / ``bytearray`` payloads of at least ``bytes_min`` bytes and text payloads of at
    least 4 KiB become :class:`Payload` placeholders and are skipped. Ints crafted to hash alike
    (:mod:`pickleshard.picklekit.hashalike`; ``alike=`` shares the count between unpicklers)
    are refused with :class:`NotInspectable`, the refusal noted, before a set or dict of them
    is built.
    """

    dispatch: ClassVar[dict[int, Any]] = dict(SpanUnpickler.dispatch)

    def __init__(
        self,
        file: SpanFile,
        *,
        bytes_min: int = 0,
        refusals: Refusals | None = None,
        alike: AlikeInts | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(file, **kwargs)
        self._bytes_min = bytes_min
        self.refusals = refusals if refusals is not None else Refusals()
        self._alike = alike if alike is not None else AlikeInts()

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        real = _REAL.get(key)
        if real is not None:
            return real
        evaluate = _EVALUATED.get(key)
        if evaluate is not None:
            return _Evaluator(evaluate, key, self.refusals)
        if key in CHECKS:
            return Opaque.checked(key, self.refusals)
        return Opaque(f"{module}.{name}")

    def get_extension(self, code: int) -> None:
        # copyreg's registry read as data; its cache holds real imported objects: never read
        # from it (calling one would run code), never fill it with stand-ins
        key = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        if not key:
            raise pickle.UnpicklingError(f"unregistered extension code {code}")
        self.append(self.find_class(*key))

    def _payload(self, n: int, kind: str, make: Callable[[bytes], Any]) -> None:
        if n < (_TEXT_PLACEHOLDER_MIN if kind == "text" else self._bytes_min):
            self.append(make(self.read(n)))
        elif n < _TEXT_PLACEHOLDER_MIN:
            offset = self.span.offset
            self.append(Payload.make(self.read(n), offset, n, kind))
        else:
            self.append(Payload.make(b"", self.span.offset, n, kind))
            self.span.skip(n)

    def load_short_binbytes(self) -> None:
        self._payload(self.read(1)[0], "bytes", bytes)

    def load_binbytes(self) -> None:
        self._payload(U4(self.read(4))[0], "bytes", bytes)

    def load_binbytes8(self) -> None:
        self._payload(U8(self.read(8))[0], "bytes", bytes)

    def load_bytearray8(self) -> None:
        self._payload(U8(self.read(8))[0], "bytearray", bytearray)

    def load_binstring(self) -> None:
        n = I4(self.read(4))[0]
        if n < 0:
            raise pickle.UnpicklingError("BINSTRING pickle has negative byte count")
        # a Python 2 str: its bytes load unchanged where the encoding maps bytes one to one
        # (numpy's __setstate__ encodes a latin-1 str back), so an array's rows are in place
        encoding = getattr(self, "encoding", "ASCII")  # pickle._Unpickler sets it
        raw = encoding == "bytes" or _is_latin1(encoding)
        self._payload(n, "string" if raw else "text", self._decode_string)

    def load_binunicode(self) -> None:
        self._payload(U4(self.read(4))[0], "text", lambda b: str(b, "utf-8", "surrogatepass"))

    def load_binunicode8(self) -> None:
        self._payload(U8(self.read(8))[0], "text", lambda b: str(b, "utf-8", "surrogatepass"))

    def _push_int(self, value: int, raw: bytes) -> None:
        """Push an int, counting it first: a set or dict of ints crafted to hash alike is
        refused (noted in :attr:`refusals`), never built, by an inert evaluation."""
        most = self._alike.add(value, raw)
        if most:
            why = hash_flood_message(most)
            self.refusals.note(why)
            raise NotInspectable(why)
        self.append(value)

    def load_long1(self) -> None:
        raw = self.read(self.read(1)[0])
        self._push_int(int.from_bytes(raw, "little", signed=True), raw)

    def load_long4(self) -> None:
        n = I4(self.read(4))[0]
        if n < 0:
            raise pickle.UnpicklingError("LONG pickle has negative byte count")
        raw = self.read(n)
        self._push_int(int.from_bytes(raw, "little", signed=True), raw)

    def load_int(self) -> None:  # as pickle's: 00 and 01 are protocol 0's False and True
        raw = self.readline()
        if raw in (b"00\n", b"01\n"):
            self.append(raw == b"01\n")
        else:
            self._push_int(int(raw, 0), raw)

    def load_long(self) -> None:
        raw = self.readline()[:-1]
        self._push_int(int(raw[:-1] if raw.endswith(b"L") else raw, 0), raw)

    dispatch[pickle.SHORT_BINBYTES[0]] = load_short_binbytes
    dispatch[pickle.BINBYTES[0]] = load_binbytes
    dispatch[pickle.BINBYTES8[0]] = load_binbytes8
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8
    dispatch[pickle.BINUNICODE[0]] = load_binunicode
    dispatch[pickle.BINSTRING[0]] = load_binstring
    dispatch[pickle.BINUNICODE8[0]] = load_binunicode8
    dispatch[pickle.LONG1[0]] = load_long1
    dispatch[pickle.LONG4[0]] = load_long4
    dispatch[pickle.INT[0]] = load_int
    dispatch[pickle.LONG[0]] = load_long
