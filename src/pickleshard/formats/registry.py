"""The format registry: which :class:`~pickleshard.formats.base.Format` class a name stands for.

A format is a class that carries its ``name``; :func:`register_format` makes it known, after
which ``convert(..., to=name)`` writes it, :func:`~pickleshard.formats.open_dataset` opens what
it wrote (the descriptor records the name), and :class:`pickleshard.testing.FormatTests` runs on
it. A third-party format is the class and one call::

    class JsonDirFormat(Format):
        name = "jsondir"
        ...

    register_format(JsonDirFormat)

The built-in formats are registered by import path and imported on first use, so that naming one
never imports another's backend (LMDB's is optional). A process that opens a conversion must
have registered its format too: the registry is per process, as fsspec's is.
"""

from __future__ import annotations

import importlib
import re

from ..errors import AlreadyRegisteredError
from .base import Format

__all__ = ["BUILTIN_FORMATS", "available_formats", "format_class", "get_format", "register_format"]

#: the formats that ship with pickleshard: name -> ``module:Class``, imported on first use
BUILTIN_FORMATS: dict[str, str] = {
    "memmap": "pickleshard.formats.memmap:MemmapFormat",
    "lmdb": "pickleshard.formats.lmdb:LmdbFormat",
    "webdataset": "pickleshard.formats.webdataset:WebDatasetFormat",
    "parquet": "pickleshard.formats.arrow.format:ParquetFormat",
    "arrow": "pickleshard.formats.arrow.format:ArrowFormat",
    "lance": "pickleshard.formats.lance:LanceFormat",
    "arrayrecord": "pickleshard.formats.arrayrecord:ArrayRecordFormat",
}
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,47}")

_known: dict[str, str] = dict(BUILTIN_FORMATS)  # registered by path, not yet imported
_classes: dict[str, type[Format]] = {}  # registered (or imported) classes


def register_format(cls: type[Format], *, clobber: bool = False) -> type[Format]:
    """Make ``cls`` the format called ``cls.name``; returns ``cls`` (usable as a decorator).

    ``cls.name`` must be a lowercase identifier (``[a-z][a-z0-9_-]*``, at most 48 characters):
    it is written into every descriptor. Registering the same class again does nothing; another
    class under a name already taken raises :class:`~pickleshard.errors.AlreadyRegisteredError`
    (a ``ValueError``) unless ``clobber=True``.
    """
    if not (isinstance(cls, type) and issubclass(cls, Format)):
        raise TypeError(f"register_format takes a Format subclass, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"{cls.__qualname__}.name must be a lowercase identifier ([a-z][a-z0-9_-]*), "
            f"got {name!r}"
        )
    held = _classes.get(name)
    if held is None and name in _known and _known[name] != _path_of(cls):
        held = format_class(name)
    if held is not None and held is not cls and not clobber:
        raise AlreadyRegisteredError("format", name, _path_of(held))
    _known.pop(name, None)
    _classes[name] = cls
    return cls


def available_formats() -> tuple[str, ...]:
    """The names of every registered format, built-ins first (nothing is imported)."""
    return tuple(dict.fromkeys([*BUILTIN_FORMATS, *_known, *_classes]))


def format_class(name: str) -> type[Format]:
    """The class registered as ``name``; ``ValueError`` if there is none.

    Raises :class:`~pickleshard.errors.MissingDependencyError` only when the format is used,
    not here (a backend's package is imported by the format when it writes or reads).
    """
    cls = _classes.get(name)
    if cls is not None:
        return cls
    path = _known.get(name)
    if path is None:
        raise ValueError(
            f"unknown format {name!r}; expected one of {', '.join(available_formats())} "
            "(a third-party format must be registered with "
            "pickleshard.formats.register_format first)"
        )
    module, _, qualname = path.partition(":")
    found: type[Format] = getattr(importlib.import_module(module), qualname)
    _classes.setdefault(name, found)  # a built-in module registers itself on import
    _known.pop(name, None)
    return found


def get_format(fmt: str | Format | type[Format]) -> Format:
    """A format instance for ``fmt``: a registered name, a registered class (built with no
    arguments), or an instance of a registered class (returned as is).

    Raises ``ValueError`` for an unknown name, and for a class or instance that is not the one
    registered under its ``name``: :func:`~pickleshard.formats.open_dataset` finds a
    conversion's format by that name alone, so anything else could be written but not opened.
    """
    if isinstance(fmt, str):
        return format_class(fmt)()
    cls = type(fmt) if isinstance(fmt, Format) else fmt
    if not (isinstance(cls, type) and issubclass(cls, Format)):
        raise TypeError(f"expected a format name, Format class or Format instance, got {fmt!r}")
    name = getattr(cls, "name", None)
    try:
        held = format_class(name) if isinstance(name, str) else None
    except ValueError:
        held = None
    if held is not cls:
        what = "not registered" if held is None else f"registered as {_path_of(held)}"
        raise ValueError(
            f"format class {_path_of(cls)} (name {name!r}) is {what}: open_dataset could not "
            "open what it writes; register it with pickleshard.formats.register_format"
        )
    return fmt if isinstance(fmt, Format) else cls()


def _path_of(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
