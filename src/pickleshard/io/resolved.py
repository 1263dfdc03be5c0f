"""A dataset source resolved to its files: the root, the relative paths, and the options every
file of it is opened with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .options import SourceOptions

__all__ = ["ResolvedSource"]


@dataclass(frozen=True)
class ResolvedSource:
    """``root`` is the directory every file is stored relative to; ``files`` are relative paths;
    ``options`` are what a URL's objects are opened with (:func:`pickleshard.io.open_source`;
    None: fsspec's own configuration), left out of its repr and its equality (credentials)."""

    root: Path
    files: tuple[str, ...]
    is_directory: bool
    options: SourceOptions | None = field(default=None, repr=False, compare=False)

    def absolute(self, rel: str) -> Path:
        return self.root / rel
