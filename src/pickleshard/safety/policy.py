"""Restricted unpickling: only allowlisted globals load unless the caller says otherwise.

Unpickling runs code: ``REDUCE`` calls whatever callable ``GLOBAL``/``STACK_GLOBAL`` (or an
``EXT`` code) named. Every callable and class a pickle can reach passes through
:meth:`pickle.Unpickler.find_class`, so restricting it restricts what a file can run. The
default allowlist (:mod:`pickleshard.safety.allowlist`) is what training data needs.

Two ways out, both explicit arguments (there is no global switch): ``trusted=True`` loads
everything, ``allow_globals=["module.name", ...]`` adds named globals.

``torch.storage._load_from_bytes`` (how ``pickle.dump`` writes a tensor's storage) calls
``torch.load(weights_only=False)``; it is mapped to a ``torch.load(weights_only=True)`` load.
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from ..errors import UnsafePickleError
from .allowlist import ALLOWED_GLOBALS, classify_global, parse_allow_globals, preset_for
from .audit.files import locate_global
from .bounds import DEFAULT_MAX_DEPTH, DEFAULT_MAX_SAMPLE_BYTES, check_sample
from .guards import BUILD_WHY, GuardedCallable, GuardedClass, guard_global, import_global

__all__ = [
    "DEFAULT_POLICY",
    "GUARD_TYPES",
    "AllowlistFindClass",
    "UnpicklePolicy",
    "guard_misuse",
]


def _torch_load_from_bytes(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def _refusal(
    module: str, name: str, path: str, offset: int | None, sample: int | None
) -> UnsafePickleError:
    verdict = classify_global(module, name)
    preset = preset_for(module, name)  # a known producer's: its whole preset, not one global
    way = (
        f"allow its producer's vetted preset with allow='{preset}' (CLI: --allow {preset})"
        if preset
        else f"allow just this global with allow_globals=['{module}.{name}'] "
        f"(CLI: --allow-global {module}.{name})"
    )
    return UnsafePickleError(
        path,
        f"refuses to load global {module}.{name} ({verdict}); only allowlisted globals load "
        f"by default. If you trust this file, pass trusted=True (CLI: --trusted), or {way}",
        offset=offset,
        sample=sample,
    )


def _guarded_refusal(
    qualname: str, why: str, path: str, offset: int | None, sample: int | None
) -> UnsafePickleError:
    return UnsafePickleError(
        path,
        f"refuses {qualname}: {why}. The allowlist admits this global but not this use of it; "
        "if you trust this file, pass trusted=True (CLI: --trusted)",
        offset=offset,
        sample=sample,
    )


class _Lookup:
    """The allowlist's ``find_class`` and the guards it hands out (one per global and file, so
    a global comes out as the same object every time: identity within a sample holds)."""

    def __init__(self, path: str, extra: frozenset[tuple[str, str]]) -> None:
        self.path, self.extra = path, extra
        self.sample: int | None = None
        self._given: dict[tuple[str, str], Any] = {}

    def offset(self) -> int | None:
        return None

    def refuse(self, qualname: str, why: str) -> UnsafePickleError:
        return _guarded_refusal(qualname, why, self.path, self.offset(), self.sample)

    def lookup(self, module: str, name: str) -> Any:
        key = (module, name)
        got = self._given.get(key)
        if got is not None:
            return got
        if key == ("torch.storage", "_load_from_bytes"):
            obj = TorchPayload(self)
        elif key in ALLOWED_GLOBALS or key in self.extra:
            obj = guard_global(key, import_global(module, name), self)
        else:
            raise _refusal(module, name, self.path, self.offset(), self.sample)
        self._given[key] = obj
        return obj


class TorchPayload:
    """``torch.storage._load_from_bytes`` as the allowlist hands it out: a ``weights_only=True``
    load of the nested bytes, whose refusal names this file and sample (not torch's advice to
    load with ``weights_only=False``). ``BUILD`` on it is refused as on any guarded global."""

    __slots__ = ("_owner",)

    def __init__(self, owner: _Lookup) -> None:
        self._owner = owner

    def __call__(self, data: Any) -> Any:
        import pickle as _pickle

        try:
            return _torch_load_from_bytes(data)
        except _pickle.UnpicklingError as exc:
            first = str(exc).split("\n")
            detail = next((line for line in first if "GLOBAL" in line or "global" in line), "")
            raise self._owner.refuse(
                "torch.storage._load_from_bytes",
                "its nested torch payload is refused by torch's weights_only loader"
                + (f" ({detail.strip()})" if detail else ""),
            ) from None

    def __setstate__(self, state: Any) -> None:
        raise self._owner.refuse("torch.storage._load_from_bytes", BUILD_WHY)

    def __reduce__(self) -> tuple[Any, ...]:
        return (import_global, ("torch.storage", "_load_from_bytes"))


def guard_misuse(
    exc: BaseException, path: str, offset: int | None, sample: int | None = None
) -> UnsafePickleError | None:
    """The refusal to raise when an unpickler failed because a pickle used a guarded global as
    a class (``NEWOBJ`` needs a real type: ``bytes.__new__(bytes, 10**9)`` would allocate a
    gigabyte), else None. The C unpickler reports it as a bad type, which is not the story."""
    text = str(exc)
    if not isinstance(exc, pickle.UnpicklingError) or not text.startswith("NEWOBJ"):
        return None
    if not any(t.__name__ in text for t in GUARD_TYPES):
        return None
    return UnsafePickleError(
        path,
        "refuses NEWOBJ on an allowlisted global that a pickle may only call (a few bytes such "
        "as bytes.__new__(bytes, 10**9) would allocate a gigabyte); if you trust this file, "
        "pass trusted=True (CLI: --trusted)",
        offset=offset,
        sample=sample,
    )


class RestrictedUnpickler(pickle.Unpickler):
    """A C unpickler whose ``find_class`` admits only the allowlist (plus ``extra``), handing
    out guards (:mod:`pickleshard.safety.guards`) where a global could be abused or changed."""

    def __init__(
        self,
        file: IO[bytes],
        *,
        path: str,
        extra: frozenset[tuple[str, str]] = frozenset(),
        encoding: str = "ASCII",
        buffers: Iterable[Any] | None = None,
        sample: int | None = None,
    ) -> None:
        super().__init__(file, encoding=encoding, buffers=buffers)
        self._lookup = _FileLookup(path, extra, file)
        self._lookup.sample = sample

    def find_class(self, module: str, name: str) -> Any:
        return self._lookup.lookup(module, name)


class _FileLookup(_Lookup):
    """:class:`_Lookup` for a load from a file object: a refusal names the offset of the opcode
    that names (or changes) the global, found by the audit walk from where the load began."""

    def __init__(self, path: str, extra: frozenset[tuple[str, str]], file: IO[bytes]) -> None:
        super().__init__(path, extra)
        self._file = file
        try:
            self._start: int | None = file.tell()
        except (AttributeError, OSError, ValueError):
            self._start = None
        self._asked: tuple[str, str] | None = None

    def lookup(self, module: str, name: str) -> Any:
        self._asked = (module, name)
        return super().lookup(module, name)

    def refuse(self, qualname: str, why: str) -> UnsafePickleError:
        return _guarded_refusal(qualname, why, self.path, self._where(qualname), self.sample)

    def offset(self) -> int | None:
        return self._where(None)

    def _where(self, qualname: str | None) -> int | None:
        if self._start is None:
            return None
        try:
            return locate_global(self._file, self._start, self._asked, qualname)
        except Exception:  # a damaged stream: the refusal still names the file
            return None


class AllowlistFindClass(_Lookup):
    """A ``find_class(module, name)`` callable with the checks of :class:`RestrictedUnpickler`,
    for unpicklers built elsewhere (the span reader). Set ``sample`` before each read so that a
    refusal names the sample as well as ``path``. The guards it hands out are kept, one per
    global, so cached values and literal prologues see the same objects."""

    def __init__(self, path: str, extra: frozenset[tuple[str, str]] = frozenset()) -> None:
        super().__init__(path, extra)

    def __call__(self, module: str, name: str) -> Any:
        return self.lookup(module, name)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_given"] = {}  # guards are per process; pickled back as their globals anyway
        return state


@dataclass(frozen=True)
class UnpicklePolicy:
    """How every read path unpickles: which globals may load, the text ``encoding``, and the
    per-sample bounds ``max_sample_bytes`` / ``max_depth`` (None: unbounded; see
    :mod:`pickleshard.safety.bounds` for the defaults and why).

    Built from the public arguments ``trusted``, ``allow_globals``, ``encoding`` (as in
    :func:`pickle.load`; ``"latin1"`` reads Python 2 pickles of numpy arrays),
    ``max_sample_bytes`` and ``max_depth`` with :meth:`from_args`. Picklable, so it travels to
    index and DataLoader workers.
    """

    trusted: bool = False
    allow_globals: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    encoding: str = "ASCII"
    max_sample_bytes: int | None = DEFAULT_MAX_SAMPLE_BYTES
    max_depth: int | None = DEFAULT_MAX_DEPTH

    @classmethod
    def from_args(
        cls,
        *,
        trusted: bool = False,
        allow_globals: Iterable[str] = (),
        encoding: str = "ASCII",
        max_sample_bytes: int | None = DEFAULT_MAX_SAMPLE_BYTES,
        max_depth: int | None = DEFAULT_MAX_DEPTH,
    ) -> UnpicklePolicy:
        for name, bound in (("max_sample_bytes", max_sample_bytes), ("max_depth", max_depth)):
            if bound is not None and (not isinstance(bound, int) or bound < 1):
                raise ValueError(f"{name} must be a positive int or None, got {bound!r}")
        return cls(
            trusted, parse_allow_globals(allow_globals), encoding, max_sample_bytes, max_depth
        )

    def check_sample(self, sample: Any, path: str | os.PathLike[str], index: int | None) -> None:
        """Raise :class:`~pickleshard.errors.SampleLimitError` naming ``path`` and ``index`` if
        ``sample`` passes this policy's bounds (checked even when ``trusted``: trust is about
        what a file may run, not how much memory a sample may take)."""
        if self.max_sample_bytes is None and self.max_depth is None:
            return
        check_sample(sample, os.fspath(path), index, self.max_sample_bytes, self.max_depth)

    def unpickler(
        self,
        file: IO[bytes],
        path: str | os.PathLike[str],
        *,
        buffers: Iterable[Any] | None = None,
        sample: int | None = None,
    ) -> pickle.Unpickler:
        """The one place pickleshard constructs an unpickler: restricted unless ``trusted``."""
        if self.trusted:
            return pickle.Unpickler(file, encoding=self.encoding, buffers=buffers)
        copyreg.clear_extension_cache()  # else a cached EXT code never reaches find_class
        return RestrictedUnpickler(
            file,
            path=os.fspath(path),
            extra=self.allow_globals,
            encoding=self.encoding,
            buffers=buffers,
            sample=sample,
        )

    def find_class(self, path: str | os.PathLike[str]) -> AllowlistFindClass | None:
        """The global lookup for unpicklers built outside :meth:`unpickler` (the span reader):
        None (plain lookup) when ``trusted``, else the allowlist naming ``path``."""
        if self.trusted:
            return None
        return AllowlistFindClass(os.fspath(path), self.allow_globals)


DEFAULT_POLICY = UnpicklePolicy()

GUARD_TYPES: tuple[type, ...] = (GuardedCallable, GuardedClass, TorchPayload)
"""The types of what the allowlist hands out in place of globals (immutable: a reader may
cache them across reads)."""
