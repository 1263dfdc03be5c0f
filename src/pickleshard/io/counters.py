"""Bytes that storage delivered to this process, from ``/proc/self/io`` (Linux).

``read_bytes`` there counts what the block layer fetched for this process (readahead included,
page-cache hits excluded): the honest "bytes fetched", as opposed to the bytes a scanner examined.
"""

from __future__ import annotations

__all__ = ["storage_read_bytes"]


def storage_read_bytes(thread: bool = False) -> int | None:
    """This process's ``read_bytes`` so far (``thread``: the calling thread's, from
    ``/proc/thread-self/io``), or None where the counter is unavailable."""
    try:
        with open("/proc/thread-self/io" if thread else "/proc/self/io", "rb") as fh:
            for line in fh:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
