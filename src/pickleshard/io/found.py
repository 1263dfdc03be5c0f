"""What a directory holds when its scan found no pickle files: words for the error."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

__all__ = ["describe_directory"]

_LOOK = 10_000  # files examined at most: the error must come fast even on a huge tree
_SHOWN = 5


def describe_directory(root: Path, skip: str) -> str:
    """A few file names under ``root`` (directories named ``skip`` left out), their count by
    extension, and the glob or ``files=`` list that would take them; "" for an empty tree."""
    names: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != skip)
        names += [os.path.relpath(os.path.join(dirpath, n), root) for n in sorted(filenames)]
        if len(names) >= _LOOK:
            break
    if not names:
        return "the directory holds no files"
    counts = Counter(Path(n).suffix or "(no extension)" for n in names)
    by_ext = ", ".join(f"{n} {ext}" for ext, n in counts.most_common(6))
    shown = ", ".join(names[:_SHOWN]) + (" ..." if len(names) > _SHOWN else "")
    ext, _ = counts.most_common(1)[0]
    pattern = "*" if ext == "(no extension)" else f"*{ext}"
    glob = os.path.join(root, "**", pattern)
    return (
        f"found {len(names)}{'+' if len(names) >= _LOOK else ''} other file(s) ({by_ext}): "
        f"{shown}. If they are pickles, name them: PickleDataset({glob!r}) (a glob; ** recurses) "
        "or PickleDataset([file, ...]) (a list of files)"
    )
