"""The output directory of a conversion: already this conversion, or something to refuse; its
size; the error for a full disk."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from ...errors import OutputExistsError, OutputSpaceError
from ...formats.base import DESCRIPTOR_NAME
from ...formats.staging import Staging

__all__ = ["finished", "out_of_space", "size_of"]


def finished(out: Path, identity: dict[str, Any], overwrite: bool) -> bool:
    """True if ``out`` already holds this conversion; raise if it holds something else."""
    if not os.path.lexists(out):
        return False
    if not out.is_dir():
        raise OutputExistsError(out, "exists and is not a directory; choose another output path")
    desc_path = out / DESCRIPTOR_NAME
    if desc_path.is_file():
        try:
            if json.loads(desc_path.read_text()).get("identity") == identity:
                return True
        except (OSError, ValueError):
            pass
        if overwrite:
            return False
        raise OutputExistsError(
            out,
            "holds a conversion of another source or with other options; pass "
            "overwrite=True (CLI: --overwrite) to replace it",
        )
    if any(out.iterdir()):
        raise OutputExistsError(
            out, "exists and is not a pickleshard conversion; refusing to write into it"
        )
    return False


def size_of(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def out_of_space(stage: Staging, parts: int, exc: OSError) -> OutputSpaceError:
    """The error for a full output file system: what is kept, and that a rerun resumes."""
    kept = size_of(stage.path) if stage.path.is_dir() else 0
    what = "no space left on device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
    step = (
        f"while merging the {parts} finished parts"
        if len(stage.done) == parts
        else f"after writing {len(stage.done)} of {parts} parts"
    )
    err = OutputSpaceError(
        stage.out,
        f"{what} {step} ({kept / 1e6:.1f} MB kept in {stage.path}); free space and rerun the "
        "same command to resume",
    )
    err.errno = exc.errno
    return err
