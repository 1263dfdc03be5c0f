"""The allowlist: which globals a pickle may load by default, and a verdict on any other.

Decided by name only, nothing imported: :data:`ALLOWED_GLOBALS` is what training data needs
(builtin containers and scalars, ``collections.OrderedDict``, numpy array/scalar/dtype
reconstruction under both numpy 1.x (``numpy.core``) and 2.x (``numpy._core``) module paths,
and torch tensor rebuild functions); :func:`classify_global` tells an audit which of the others
are only ever used to run code; :func:`parse_allow_globals` reads the ``allow_globals``
argument. :mod:`pickleshard.safety.policy` enforces it while unpickling.

Named presets (``allow="pandas"``, CLI ``--allow pandas``) extend it by one producer's vetted
globals: :data:`PRESETS` is a read-only view of them, :func:`register_preset` adds one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Literal

from ..errors import AlreadyRegisteredError

__all__ = [
    "ALLOWED_GLOBALS",
    "PRESETS",
    "Verdict",
    "available_presets",
    "classify_global",
    "parse_allow_globals",
    "preset_for",
    "preset_globals",
    "preset_names",
    "register_preset",
]

_BUILTINS: tuple[str, ...] = (
    "list",
    "dict",
    "tuple",
    "set",
    "frozenset",
    "bytearray",
    "bytes",
    "str",
    "int",
)
_BUILTINS += ("float", "complex", "bool", "slice", "range")
_NUMPY = [
    (mod, name)
    for core in ("numpy.core", "numpy._core")
    for mod, name in (
        (f"{core}.multiarray", "_reconstruct"),
        (f"{core}.multiarray", "scalar"),
        (f"{core}.numeric", "_frombuffer"),
    )
] + [("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.dtypes", "StringDType")]
_TORCH = [
    ("torch._utils", n)
    for n in (
        "_rebuild_tensor",
        "_rebuild_tensor_v2",
        "_rebuild_tensor_v3",
        "_rebuild_parameter",
        "_rebuild_parameter_with_state",
        "_rebuild_device_tensor_from_numpy",
    )
] + [
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch.storage", "_load_from_bytes"),
    ("torch", "Tensor"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch.nn.parameter", "Parameter"),
]

ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [("builtins", n) for n in _BUILTINS]
    + [("__builtin__", n) for n in _BUILTINS]  # Python 2 pickles
    + [("collections", "OrderedDict"), ("_codecs", "encode")]
    + _NUMPY
    + _TORCH
)

# Modules and names whose only use in a data file is to run code. The audit names them.
_DANGEROUS_MODULES: tuple[str, ...] = (
    "os",
    "posix",
    "nt",
    "subprocess",
    "sys",
    "shutil",
    "importlib",
    "runpy",
)
_DANGEROUS_MODULES += ("socket", "pty", "ctypes", "marshal", "code", "webbrowser", "pickle")
_DANGEROUS_MODULES += ("_pickle", "types", "commands", "multiprocessing", "signal")
_DANGEROUS_BUILTINS: tuple[str, ...] = (
    "eval",
    "exec",
    "compile",
    "__import__",
    "open",
    "getattr",
    "setattr",
)
_DANGEROUS_BUILTINS += ("delattr", "globals", "locals", "vars", "breakpoint", "input")
# Single names elsewhere that load code or reach any attribute (gadgets in known exploits).
_DANGEROUS_NAMES: frozenset[tuple[str, str]] = frozenset(
    {
        ("torch", "load"),
        ("torch.serialization", "load"),
        ("torch.serialization", "_load"),
        ("operator", "attrgetter"),
        ("operator", "methodcaller"),
        ("_operator", "attrgetter"),
        ("_operator", "methodcaller"),
        ("io", "open"),
        ("_io", "open"),
        ("codecs", "open"),
        ("numpy", "load"),
        ("numpy.lib.npyio", "load"),
        ("joblib", "load"),
        ("dill", "loads"),
    }
)

Verdict = Literal["allowed", "not allowed", "dangerous"]


def classify_global(module: str, name: str, extra: Iterable[tuple[str, str]] = ()) -> Verdict:
    """Verdict on a global a pickle references, by name only: nothing is imported.

    "allowed": on the allowlist or in ``extra`` (``allow_globals``). "dangerous": a module whose
    only use in a data file is running code (``os``/``posix``/``nt``, ``subprocess``,
    ``shutil``, ``socket``, ``pickle``...), a builtin that evaluates, imports or reaches any
    attribute (``eval``, ``exec``, ``__import__``, ``getattr``, ``open``...), or a named loader
    or gadget (``torch.load``, ``operator.methodcaller``...). "not allowed": anything else.
    ``torch.storage._load_from_bytes`` is allowed because the readers map it to a
    ``weights_only=True`` load.
    """
    if (module, name) in ALLOWED_GLOBALS or (module, name) in set(extra):
        return "allowed"
    top = module.split(".", 1)[0]
    if (
        top in _DANGEROUS_MODULES
        or (module in ("builtins", "__builtin__") and name in _DANGEROUS_BUILTINS)
        or (module, name) in _DANGEROUS_NAMES
    ):
        return "dangerous"
    return "not allowed"


def parse_allow_globals(names: Iterable[str]) -> frozenset[tuple[str, str]]:
    """Turn ``["module.name", "pkg.mod:Class.attr"]`` into ``(module, name)`` pairs.

    ``module:qualname`` separates a nested qualname explicitly; otherwise the last dot splits.
    """
    out = set()
    for text in names:
        module, sep, name = text.partition(":") if ":" in text else text.rpartition(".")
        if not sep or not module or not name:
            raise ValueError(f"allow_globals entries look like 'module.name', got {text!r}")
        out.add((module, name))
    return frozenset(out)


# Named presets (``allow="pandas"``): the globals one producer's files need, vetted one by one:
# each rebuilds a data container from its parts (arrays, dtypes, index labels) and none
# imports, evaluates or opens anything. Kept short on purpose: a name joins only once a real
# file of that producer needs it (tests/test_producers_*.py build those files).
_PANDAS_CORE = [
    "DataFrame",
    "Series",
    "Index",
    "RangeIndex",
    "MultiIndex",
    "DatetimeIndex",
    "TimedeltaIndex",
    "CategoricalIndex",
    "Categorical",
    "CategoricalDtype",
    "StringDtype",
    "Int8Dtype",
    "Int16Dtype",
    "Int32Dtype",
    "Int64Dtype",
    "UInt8Dtype",
    "UInt16Dtype",
    "UInt32Dtype",
    "UInt64Dtype",
    "Float32Dtype",
    "Float64Dtype",
    "BooleanDtype",
    "DatetimeTZDtype",
    "Timestamp",
    "Timedelta",
]
_PANDAS: tuple[tuple[str, str], ...] = (
    *(("pandas", n) for n in _PANDAS_CORE),
    *(
        ("pandas.arrays", n)
        for n in (
            "ArrowStringArray",
            "StringArray",
            "DatetimeArray",
            "TimedeltaArray",
            "IntegerArray",
            "FloatingArray",
            "BooleanArray",
        )
    ),
    ("pandas.core.internals.managers", "BlockManager"),
    ("pandas.core.internals.managers", "SingleBlockManager"),
    ("pandas._libs.internals", "_unpickle_block"),
    ("pandas._libs.arrays", "__pyx_unpickle_NDArrayBacked"),
    ("pandas.core.indexes.base", "_new_Index"),
    ("pandas.core.indexes.datetimes", "_new_DatetimeIndex"),
    *(("pandas._libs.tslibs.offsets", n) for n in ("Day", "Hour", "Minute", "Second")),
    # pandas >= 3 stores str columns as Arrow arrays: rebuilt from a type alias and buffers
    ("pyarrow.lib", "_restore_array"),
    ("pyarrow.lib", "type_for_alias"),
    ("pyarrow.lib", "py_buffer"),
)
_PRESETS: dict[str, frozenset[tuple[str, str]]] = {
    "pandas": frozenset(_PANDAS),
    # dill writes every ndarray as _create_array(f, args, state): it calls f (a global the
    # allowlist already vetted) and sets the array's state; it names nothing itself.
    "dill": frozenset({("dill._dill", "_create_array")}),
    "pil": frozenset({("PIL.Image", "Image")}),
    "scipy.sparse": frozenset(
        ("scipy.sparse._" + kind, kind + "_" + what)
        for kind in ("csr", "csc", "coo", "bsr", "dia", "lil", "dok")
        for what in ("matrix", "array")
    ),
}
PRESETS: Mapping[str, frozenset[tuple[str, str]]] = MappingProxyType(_PRESETS)
"""Named allowlist extensions (``allow=["pandas"]``): see ``docs/producers.md``. Read-only:
:func:`register_preset` adds one."""

_PRESET_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,47}")


def register_preset(name: str, allow_globals: Iterable[str], *, clobber: bool = False) -> None:
    """Make ``allow=name`` (CLI ``--allow NAME``) admit ``allow_globals``, written as the
    ``allow_globals`` argument's entries (``"module.name"`` or ``"module:qualname"``).

    A preset is a vetted set: the globals one producer's files need to rebuild its data
    containers. So ``name`` must be a lowercase identifier (dots allowed: ``scipy.sparse``),
    the set must not be empty, and a global :func:`classify_global` calls dangerous is refused
    with ``ValueError`` (refusals suggest a preset that admits the global they name, and must
    never suggest one that runs code; ``allow_globals`` still admits such a global one by one).
    Registering the same globals again does nothing; other globals under a name already taken
    raise :class:`~pickleshard.errors.AlreadyRegisteredError` unless ``clobber=True``.
    """
    if not isinstance(name, str) or not _PRESET_NAME.fullmatch(name):
        raise ValueError(
            f"a preset name must be a lowercase identifier ([a-z][a-z0-9_.-]*), got {name!r}"
        )
    if isinstance(allow_globals, str):  # one "module.name" would be read letter by letter
        raise TypeError(
            f"register_preset takes a list of globals, got the string {allow_globals!r}"
        )
    pairs = parse_allow_globals(allow_globals)
    if not pairs:
        raise ValueError(f"preset {name!r} admits no globals")
    dangerous = sorted(f"{m}.{n}" for m, n in pairs if classify_global(m, n) == "dangerous")
    if dangerous:
        raise ValueError(
            f"preset {name!r} would admit dangerous globals ({', '.join(dangerous)}): a preset "
            "only rebuilds data containers; allow such a global with allow_globals instead"
        )
    held = _PRESETS.get(name)
    if held is not None and held != pairs and not clobber:
        raise AlreadyRegisteredError("allow preset", name, _describe(held))
    _PRESETS[name] = pairs


def _describe(pairs: frozenset[tuple[str, str]]) -> str:
    names = sorted(f"{m}.{n}" for m, n in pairs)
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"a preset of {len(names)} globals ({', '.join(names[:3])}{more})"


def available_presets() -> tuple[str, ...]:
    """The names :func:`preset_globals` knows, built-ins first (the CLI's ``--allow`` choices)."""
    return tuple(_PRESETS)


def preset_globals(names: str | Iterable[str]) -> frozenset[tuple[str, str]]:
    """The globals of the named presets (one name or several); ``ValueError`` naming the
    known presets for an unknown one."""
    out: set[tuple[str, str]] = set()
    for name in [names] if isinstance(names, str) else list(names):
        if name not in PRESETS:
            raise ValueError(f"unknown allow preset {name!r}; the presets are {', '.join(PRESETS)}")
        out |= PRESETS[name]
    return frozenset(out)


def preset_for(module: str, name: str) -> str | None:
    """The preset that admits global ``module.name``, if one does."""
    return next((p for p, names in PRESETS.items() if (module, name) in names), None)


def preset_names(allow: str | Iterable[str]) -> list[str]:
    """``allow`` (one preset name or several) as ``allow_globals`` entries."""
    return [f"{m}:{n}" for m, n in sorted(preset_globals(allow))]
