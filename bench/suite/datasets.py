"""The suite's pickles, and moving files in and out of the page cache.

The pickles are the seed layout (``pickle.dump((x_list, y_list))``), written by
``pickleshard.pipelines.synth.write_synthetic`` once and reused; the converted copies live beside them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from .plan import KINDS, DatasetSpec

__all__ = ["data_files", "ensure_pickles", "evict", "tree_bytes", "warm"]


def ensure_pickles(spec: DatasetSpec) -> bool:
    """Write ``spec``'s pickles unless they are all there; True if written."""
    from pickleshard.pipelines.synth import write_synthetic

    expected = {spec.directory / f"part-{f:05d}.pkl" for f in range(spec.files)}
    present = set(spec.directory.glob("*.pkl")) if spec.directory.is_dir() else set()
    if present == expected:
        return False
    shutil.rmtree(spec.directory, ignore_errors=True)
    synth_kind, shape, _ = KINDS[spec.kind]
    write_synthetic(
        spec.directory,
        files=spec.files,
        per_file=spec.per_file,
        shape=shape or (1,),
        kind=synth_kind,  # type: ignore[arg-type]
        seed=0,
    )
    return True


def data_files(*roots: Path) -> list[Path]:
    """Every regular file under ``roots`` (a file root is itself)."""
    out: list[Path] = []
    for root in roots:
        if root.is_file():
            out.append(root)
        elif root.is_dir():
            out.extend(p for p in sorted(root.rglob("*")) if p.is_file())
    return out


def tree_bytes(*roots: Path) -> int:
    return sum(p.stat().st_size for p in data_files(*roots))


def evict(paths: Iterable[Path]) -> None:
    """Drop ``paths`` from the page cache (``POSIX_FADV_DONTNEED``), so the next read is cold."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages (a conversion just written) are not dropped otherwise
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: Iterable[Path]) -> None:
    """Read ``paths`` once, so the next read comes from the page cache."""
    buf = bytearray(1 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
