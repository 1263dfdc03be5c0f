"""The benchmark's synthetic dataset: written once with ``write_synthetic``, reused when present."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from pickleshard.pipelines.synth import write_synthetic

__all__ = ["DataSpec", "ensure_data"]

PREFIX = "part"


@dataclass(frozen=True)
class DataSpec:
    """``files`` files of ``per_file`` float32 samples of ``shape`` under ``root``."""

    root: Path
    files: int
    per_file: int
    shape: tuple[int, ...]
    seed: int = 0

    @property
    def name(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return f"{self.files}x{self.per_file}-f32-{dims}-seed{self.seed}"

    @property
    def directory(self) -> Path:
        return self.root / self.name

    @property
    def folk_index(self) -> Path:
        """Where the folk JSON index goes: beside the data, not inside it."""
        return self.root / f"{self.name}.folk.json"

    @property
    def paths(self) -> list[Path]:
        return [self.directory / f"{PREFIX}-{f:05d}.pkl" for f in range(self.files)]

    @property
    def num_samples(self) -> int:
        return self.files * self.per_file


def ensure_data(spec: DataSpec) -> bool:
    """Write the dataset unless all its files are there (and no others); True if written.

    ``write_synthetic`` renames each file into place when complete and is a pure function of its
    arguments, which the directory name encodes, so a file that exists is the right one.
    """
    expected = set(spec.paths)
    present = set(spec.directory.glob("*.pkl")) if spec.directory.is_dir() else set()
    if present == expected:
        return False
    shutil.rmtree(spec.directory, ignore_errors=True)
    write_synthetic(
        spec.directory,
        files=spec.files,
        per_file=spec.per_file,
        shape=spec.shape,
        seed=spec.seed,
        prefix=PREFIX,
    )
    return True
