"""Map a data file read-only: what the scanner and the inspector read a file through.

The opcode tables and walks that used to live here are in :mod:`pickleshard.picklekit`
(``opcodes``, ``extent``, ``walker``, ``walk``); this module keeps :func:`open_buffer` until
every caller reads through :mod:`pickleshard.io`.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

from .errors import UnreadableFileError

__all__ = ["open_buffer"]


def open_buffer(path: str | os.PathLike[str]) -> tuple[Any, int]:
    """Map ``path`` read-only; return ``(buffer, size)`` (an empty file gives ``(b"", 0)``)."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return b"", 0
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), size
    except OSError as exc:
        raise UnreadableFileError(where, f"cannot read: {exc.strerror or exc}") from None
