"""Identities of remote objects this process has just looked up, so that opening one is not
a second metadata round trip.

Resolving a list of URLs asks the store for each object's metadata (fsspec ``info``: one
``HEAD`` each, all at once); an index build then opens every object, and each open asked again,
one round trip on each file's critical path (20 ms at an object store's latency, the time to
download megabytes). :func:`remember_info` keeps what ``info`` said, keyed by the object and the
storage options it was asked with; :func:`take_identity` gives it back, once (the open it
saves; a later open asks again), for at most :data:`KNOWN_FOR` seconds. Only ``info``'s own answers are kept (a listing spells times its own
way: S3's lists milliseconds where its ``HEAD`` gives seconds), so a later staleness check,
which calls ``info`` again, compares like with like. An identity taken a few seconds early can
only make an index look stale later (rebuilt), never hide a change: the bytes scanned are at
least as new as the identity recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Mapping
from datetime import datetime
from typing import Any

from ..handles import ProcessLocal
from ..identity import FileIdentity

__all__ = ["KNOWN_FOR", "identity_from_info", "remember_info", "take_identity"]

KNOWN_FOR = 30.0  # seconds an identity looked up is used for an open without asking again
_HELD = 4096  # identities kept at most (the oldest dropped first)

# this process's identities: (filesystem key, path) -> (when looked up, identity)
_KNOWN: ProcessLocal[dict[tuple[Hashable, str], tuple[float, FileIdentity]]] = ProcessLocal(dict)
_LOCK = threading.Lock()


def identity_from_info(meta: Mapping[str, Any]) -> FileIdentity:
    """Size, ETag and last-modified time of fsspec ``info`` of an object (each store spells
    them its own way); an object whose store gives no ETag has ``etag=""``."""
    etag = next(
        (str(meta[k]) for k in ("ETag", "etag", "md5Hash", "Content-MD5") if meta.get(k)), ""
    )
    mtime = next(
        (meta[k] for k in ("LastModified", "mtime", "updated", "last_modified") if meta.get(k)),
        None,
    )
    if isinstance(mtime, str):
        try:
            mtime = datetime.fromisoformat(mtime.replace("Z", "+00:00"))
        except ValueError:
            mtime = None
    if isinstance(mtime, datetime):
        mtime_ns = int(mtime.timestamp() * 1_000_000) * 1000
    elif isinstance(mtime, (int, float)):
        mtime_ns = int(mtime * 1e9)
    else:
        mtime_ns = 0  # the store does not say: the ETag and the size decide
    return FileIdentity(int(meta["size"]), mtime_ns, None, None, etag)


def remember_info(fs_key: Hashable, path: str, meta: Mapping[str, Any]) -> None:
    """Keep what ``info`` said of ``path`` on the filesystem ``fs_key`` names (an object's
    answer only: a directory's, or one without a size, is not an identity)."""
    if meta.get("type", "file") != "file" or not isinstance(meta.get("size"), int):
        return
    identity = identity_from_info(meta)
    with _LOCK:
        known = _KNOWN.get()
        if len(known) >= _HELD:
            del known[next(iter(known))]
        known[(fs_key, path)] = (time.monotonic(), identity)


def take_identity(fs_key: Hashable, path: str) -> FileIdentity | None:
    """The identity of ``path`` looked up in the last :data:`KNOWN_FOR` seconds (forgotten
    now: it serves one open), or None."""
    with _LOCK:
        got = _KNOWN.get().pop((fs_key, path), None)
    if got is None or time.monotonic() - got[0] > KNOWN_FOR:
        return None
    return got[1]
