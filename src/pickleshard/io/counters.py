"""Bytes that storage delivered to this process, from ``/proc/self/io`` (Linux).

``read_bytes`` there counts what the block layer fetched for this process (readahead included,
page-cache hits excluded): the honest "bytes fetched", as opposed to the bytes a scanner examined.
"""

from __future__ import annotations

__all__ = ["storage_read_bytes"]


def storage_read_bytes(thread: bool | int = False) -> int | None:
    """This process's ``read_bytes`` so far, or None where the counter is unavailable.
    ``thread``: True for the calling thread's (``/proc/thread-self/io``), a thread id for that
    thread of this process's (``/proc/self/task/TID/io``)."""
    where = (
        "/proc/self/io"
        if thread is False
        else "/proc/thread-self/io"
        if thread is True
        else f"/proc/self/task/{thread}/io"
    )
    try:
        with open(where, "rb") as fh:
            for line in fh:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
