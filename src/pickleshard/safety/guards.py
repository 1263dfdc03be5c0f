"""What the allowlist hands a pickle: guarded stand-ins for globals a load could abuse.

CPython's C unpickler has no ``BUILD`` hook: ``BUILD`` on a global (a function or class that
``find_class`` returned) runs ``setattr`` on it, so a data file could rewrite
``torch._utils._rebuild_tensor_v2.__defaults__`` for the whole process. And allowlisted callables
can turn a few bytes into gigabytes (``bytearray(10**9)``, ``tuple(range(10**8))``). So the
allowlist hands out, in place of such globals:

- :class:`GuardedCallable`: ``__call__`` runs the global's argument check from :data:`CHECKS`,
  then the global; ``__setstate__`` (what ``BUILD`` calls) refuses; ``__reduce__`` pickles the
  original global back. Every Python-level function and every callable with a check gets one.
- :class:`GuardedClass`: a class a pickle may only *pass* to an allowlisted rebuild function
  (``numpy.ndarray``, ``torch.Tensor``, ``torch.nn.Parameter``): calling it directly (a few
  bytes allocate a shape) is refused, and the guarded rebuild functions unwrap it.

Builtin C functions and immutable types without a check are handed out as they are: ``setattr``
on them fails. A *mutable* class named by ``allow_globals`` is handed out as it is too, since
``NEWOBJ`` needs the real type: ``BUILD`` on it first looks up ``__setstate__``, which a class
defining one answers with an unbound method (the call then fails for want of an argument), but
a class without one is open to ``BUILD``'s ``setattr``. Naming a class in ``allow_globals`` is
trusting the files that use it that far. The one table :data:`CHECKS` is shared by the loader and by the inert evaluation
of :mod:`pickleshard.inspect.file`, so ``inspect --strict`` refuses what loading refuses.

A refusal is raised by the guard's ``owner`` (:class:`GuardOwner`: the allowlist of one file,
which knows the file, offset and sample), as :class:`~pickleshard.errors.UnsafePickleError`.
"""

from __future__ import annotations

import _compat_pickle
import math
import operator
import sys
import types
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import UnsafePickleError

__all__ = [
    "BUILD_WHY",
    "CHECKS",
    "RANGE_MAX",
    "SCALAR_ITEMSIZE_MAX",
    "GuardOwner",
    "GuardedCallable",
    "GuardedClass",
    "check_call",
    "guard_global",
]

RANGE_MAX = 4096
"""Items a lazy iterable (a ``range``) or a ``str``/``bytes`` may feed into a container
constructor: the pickler never writes either, and each item costs a pointer or more."""
SCALAR_ITEMSIZE_MAX = 1 << 16
"""The largest itemsize ``numpy scalar(dtype)`` may allocate without bytes of its own."""

GlobalKey = tuple[str, str]
Check = Callable[[tuple[Any, ...], dict[str, Any]], str | None]


class GuardOwner(Protocol):
    """Whoever hands out guards: says how a refusal names the file, offset and sample."""

    def refuse(self, qualname: str, why: str) -> UnsafePickleError: ...


def _length(v: Any) -> int:
    try:
        return len(v)
    except Exception:  # a lazy object without a length: count it as unbounded
        return RANGE_MAX + 1


def _iterable_arg(what: str, args: tuple[Any, ...], *, of_bytes: bool) -> str | None:
    """A container constructor's argument: materialized containers the load made are paid for
    already; an int (``bytes(n)``), a ``range``, or a long ``str``/``bytes`` turned into one
    object per item (``of_bytes``: the constructor copies bytes one to one) are not."""
    if not args:
        return None
    v = args[0]
    if isinstance(v, (list, tuple, dict, set, frozenset)):
        return None
    if of_bytes and isinstance(v, int):
        return f"{what}({v}) allocates from a number, not from bytes in the file"
    if of_bytes and isinstance(v, (bytes, bytearray, memoryview)):
        return None
    n = _length(v)
    if n > RANGE_MAX:
        return (
            f"{what}() of a {type(v).__name__} of {n if n != RANGE_MAX + 1 else 'unknown'} "
            "items makes objects the file does not hold"
        )
    return None


def _container(what: str) -> Check:
    def check(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return _iterable_arg(what, args, of_bytes=False)

    return check


def _bytes_check(what: str) -> Check:
    def check(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        if args and isinstance(args[0], str):  # bytes(text, encoding): the text's own size
            return None
        return _iterable_arg(what, args, of_bytes=True)

    return check


def _encode(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    # protocol <= 2 writes bytes as _codecs.encode(text, "latin1"): nothing else is data, and
    # chained hex/base64 encodes double the size every ~20 bytes of file
    if len(args) == 2 and type(args[0]) is str and args[1] == "latin1":
        return None  # what the pickler writes: the hot path of protocol <= 2 reads
    encoding = args[1] if len(args) > 1 else kwargs.get("encoding", "utf-8")
    if len(args) >= 1 and isinstance(args[0], str) and encoding in ("latin1", "latin-1"):
        return None
    return "only encode(text, 'latin1') (how protocol <= 2 writes bytes) is data"


def _shape_size(shape: Any) -> int | None:
    try:
        dims = [operator.index(shape)] if not isinstance(shape, (tuple, list)) else shape
        return math.prod(operator.index(d) for d in dims)
    except Exception:
        return None


def _reconstruct(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    # numpy pickles _reconstruct(ndarray, (0,), b'b') and then BUILDs the data: a nonzero shape
    # allocates an array the file has no bytes for
    shape = args[1] if len(args) > 1 else kwargs.get("shape")
    if shape == (0,):  # what numpy writes
        return None
    size = _shape_size(shape)
    if size is None or size != 0:
        return f"shape {shape!r} allocates an array the file holds no bytes for (numpy writes (0,))"
    return None


def _scalar(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    import numpy as np

    if not args or not isinstance(args[0], np.dtype):
        return None  # numpy refuses it itself
    dtype, obj = args[0], args[1] if len(args) > 1 else kwargs.get("obj")
    if dtype.hasobject:
        return None  # an object scalar holds the object given, nothing allocated
    if obj is None:
        if dtype.itemsize > SCALAR_ITEMSIZE_MAX:
            return f"a {dtype.itemsize}-byte scalar without bytes allocates from the dtype alone"
        return None
    if isinstance(obj, (bytes, str)) and len(obj) == dtype.itemsize:
        return None  # str: a Python 2 pickle read with encoding='latin1'
    return f"a scalar of dtype {dtype} ({dtype.itemsize} bytes) from {_length(obj)} bytes"


def _direct(what: str) -> Check:
    def check(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return f"a direct call of {what} allocates from a shape (pickles rebuild it by function)"

    return check


_CORES = ("numpy.core", "numpy._core")
_BUILTIN_MODULES = ("builtins", "__builtin__")
CHECKS: dict[GlobalKey, Check] = {}
"""The argument check of each allowlisted global that has one: ``check(args, kwargs)`` returns
why the call is refused, or None. Shared by the loader and the inert evaluation."""
for _m in _BUILTIN_MODULES:
    for _n in ("list", "tuple", "set", "frozenset"):
        CHECKS[(_m, _n)] = _container(_n)
    CHECKS[(_m, "bytes")] = _bytes_check("bytes")
    CHECKS[(_m, "bytearray")] = _bytes_check("bytearray")
CHECKS[("_codecs", "encode")] = _encode
CHECKS[("torch", "Size")] = _container("torch.Size")
for _c in _CORES:
    CHECKS[(f"{_c}.multiarray", "_reconstruct")] = _reconstruct
    CHECKS[(f"{_c}.multiarray", "scalar")] = _scalar
# classes a pickle only passes to a rebuild function; a direct call allocates from a shape
GUARDED_CLASSES: frozenset[GlobalKey] = frozenset(
    {("numpy", "ndarray"), ("torch", "Tensor"), ("torch.nn.parameter", "Parameter")}
)
for _key in GUARDED_CLASSES:
    CHECKS[_key] = _direct(".".join(_key))


def check_call(key: GlobalKey, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why calling global ``key`` with these arguments is refused, or None (no check: None)."""
    check = CHECKS.get(key)
    return None if check is None else check(args, kwargs)


class _Guard:
    """What every guard shares: the global it wraps (``__wrapped__``), its key, the owner that
    names refusals; ``BUILD`` is refused, and pickling it again gives back the original."""

    __slots__ = ("__wrapped__", "_key", "_owner")
    __wrapped__: Any
    _key: GlobalKey
    _owner: GuardOwner

    def __setstate__(self, state: Any) -> None:
        raise self._owner.refuse(".".join(self._key), BUILD_WHY)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_original, self._key)

    def __eq__(self, other: object) -> bool:
        return bool(self.__wrapped__ == _unwrap_any(other))

    def __hash__(self) -> int:
        return hash(self.__wrapped__)

    def __repr__(self) -> str:
        return f"<guarded {self.__wrapped__!r}>"


class GuardedClass(_Guard):
    """A class a pickle may pass to a guarded rebuild function, which unwraps it; calling it
    directly, or ``BUILD`` on it, is refused. Not a type: ``NEWOBJ`` on it fails too."""

    __slots__ = ()

    def __init__(self, wrapped: type, key: GlobalKey, owner: GuardOwner) -> None:
        self.__wrapped__, self._key, self._owner = wrapped, key, owner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        why = check_call(self._key, args, kwargs) or "a direct call of this class is refused"
        raise self._owner.refuse(".".join(self._key), why)


BUILD_WHY = "BUILD on a global: a data file may not change a function or class of the process"


def _unwrap(v: Any) -> Any:
    return v.__wrapped__ if type(v) is GuardedClass else v


class GuardedCallable(_Guard):
    """An allowlisted callable as a pickle sees it: calls are checked (:data:`CHECKS`) and
    forwarded with guarded classes among the arguments unwrapped; ``BUILD`` is refused."""

    __slots__ = ("_check", "_unwraps")

    def __init__(self, wrapped: Callable[..., Any], key: GlobalKey, owner: GuardOwner) -> None:
        self.__wrapped__, self._key, self._owner = wrapped, key, owner
        self._check = CHECKS.get(key)
        # a guarded class can only be meant as an argument of a rebuild function (or of a
        # function allow_globals names); builtin constructors and encode never take one
        self._unwraps = key not in _TAKES_NO_CLASS

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._unwraps:
            for a in args:
                if type(a) is GuardedClass:
                    args = tuple(_unwrap(a) for a in args)
                    break
        if self._check is not None:
            why = self._check(args, kwargs)
            if why is not None:
                raise self._owner.refuse(".".join(self._key), why)
        return self.__wrapped__(*args, **kwargs)


_TAKES_NO_CLASS: frozenset[GlobalKey] = frozenset(
    {k for k in CHECKS if k[0] in _BUILTIN_MODULES}
    | {("_codecs", "encode"), ("torch", "Size")}
    | {(f"{c}.multiarray", "scalar") for c in _CORES}
)


def _unwrap_any(v: Any) -> Any:
    return v.__wrapped__ if isinstance(v, _Guard) else v


def _original(module: str, name: str) -> Any:
    """The global a guard stands for, when a sample holding one is pickled again (plain
    ``pickle.load`` gives back the original global)."""
    return import_global(module, name)


def guard_global(key: GlobalKey, obj: Any, owner: GuardOwner) -> Any:
    """What ``find_class`` hands a pickle for global ``key`` (the object ``obj``): ``obj`` itself
    when the load can neither change it nor abuse it, else a guard raising through ``owner``."""
    if key in GUARDED_CLASSES and isinstance(obj, type):
        return GuardedClass(obj, key, owner)
    if key in CHECKS or isinstance(obj, (types.FunctionType, types.MethodType)):
        return GuardedCallable(obj, key, owner)
    # Immutable types and builtin functions: setattr on them fails. A mutable class named by
    # allow_globals is handed out as it is: NEWOBJ needs the real type (see the module notes)
    return obj


def import_global(module: str, name: str) -> Any:
    """What ``pickle.Unpickler.find_class`` returns, Python 2 names mapped as it maps them."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    __import__(module)
    obj: Any = sys.modules[module]
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj
