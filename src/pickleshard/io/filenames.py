"""Which files a directory or prefix listing takes as pickles: by name, and a file without an
extension by its first bytes (CIFAR-10's ``data_batch_1``)."""

from __future__ import annotations

import pickletools
from fnmatch import fnmatch

__all__ = [
    "ARCHIVE_SUFFIXES",
    "PICKLE_PATTERNS",
    "SNIFF_BYTES",
    "is_pickle_name",
    "starts_like_pickle",
]

PICKLE_PATTERNS = ("*.pkl", "*.pickle", "*.pk", "*.p", "*.gz", "*.bz2", "*.xz", "*.zst")

#: compressed tar archives, which the compressed patterns above would otherwise take
ARCHIVE_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tar.zst")


def is_pickle_name(name: str) -> bool:
    """Whether a listed file called ``name`` (no directory part) is taken as a pickle:
    it matches :data:`PICKLE_PATTERNS` and is not a compressed tar archive (``x.tar.gz``)."""
    lowered = name.lower()
    if lowered.endswith(ARCHIVE_SUFFIXES):
        return False
    return any(fnmatch(name, pattern) for pattern in PICKLE_PATTERNS)


SNIFF_BYTES = 4096
"""How much of a file without an extension :func:`starts_like_pickle` reads."""

# The first opcode of a protocol 0 or 1 pickle of data: MARK (a tuple, or protocol 0's "(dp0"
# and "(lp0"), EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE, GLOBAL (an object, a numpy array).
_OLD_STARTS = frozenset(b"(}])c")


# what pickletools says when the bytes end inside an opcode or before STOP (not a bad byte)
_CUT_SHORT = ("not enough data", "no newline found", "but only", "exhausted before seeing STOP")


def starts_like_pickle(head: bytes) -> bool:
    """Whether ``head``, the first :data:`SNIFF_BYTES` bytes of a file (fewer: the whole
    file), starts a pickle: ``PROTO`` (``0x80``) and a protocol byte 2 to 5, or a
    protocol 0/1 start, followed by opcodes that parse up to ``STOP`` or up to the end of a
    head the read cut short (never a file that ends before its ``STOP``). Text whose first
    letters happen to be opcodes soon meets a byte that is none."""
    if len(head) >= 2 and head[0] == 0x80:
        if not 2 <= head[1] <= 5:
            return False
    elif not head or head[0] not in _OLD_STARTS:
        return False
    try:
        for op, _, _ in pickletools.genops(head):
            if op.name == "STOP":
                return True
    except ValueError as exc:  # an unknown opcode, a bad argument, or the head ends first
        cut = any(words in str(exc) for words in _CUT_SHORT)
        return cut and len(head) >= SNIFF_BYTES
    return False
