"""Identities of remote objects this process has just looked up, so that opening one is not a
second metadata round trip.

Resolving a list of URLs asks the store for each object's metadata (fsspec ``info``: one
``HEAD`` each, all at once); an index build or a dataset's check against its index then opens
every object, and a loader's first batches open each again to read it. Each open asked again,
one round trip on each file's critical path (20 ms at an object store's latency, the time to
download megabytes). Two records serve them:

- :func:`remember_info` keeps what a lookup's ``info`` said, keyed by the object and the storage
  options it was asked with; :func:`take_identity` gives it back, once (the open it saves; a
  later open asks again), for at most :data:`KNOWN_FOR` seconds. Only ``info``'s own answers are
  kept (a listing spells times its own way: S3's lists milliseconds where its ``HEAD`` gives
  seconds), so a later staleness check, which calls ``info`` again, compares like with like. An
  identity taken a few seconds early can only make an index look stale later (rebuilt), never
  hide a change: the bytes scanned are at least as new as the identity recorded.
- :func:`remember_asked` keeps every identity an open or a check asked for (or took), with the
  time it was asked; :func:`asked_identity` gives it, for :data:`KNOWN_FOR` seconds, only to
  an open that *expects* that very identity (a reader, the index's record of
  the object: :meth:`~pickleshard.io.ByteSource.expect`). Such an open counts the identity as
  seen when it was asked, so its reader checks it again once it is older than its
  ``identity_ttl``, before any sample is returned: a reader never trusts an identity older than
  it would have without this record, and one opened right after its dataset's check asks for
  none. (Its bytes it reads again, the head included: a cache of bytes would serve them after
  the store stopped taking the credentials that fetched them.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Mapping
from datetime import datetime
from typing import Any

from ..handles import ProcessLocal
from ..identity import FileIdentity

__all__ = [
    "KNOWN_FOR",
    "asked_identity",
    "identity_from_info",
    "remember_asked",
    "remember_info",
    "take_identity",
]

KNOWN_FOR = 30.0  # seconds an identity looked up is used for an open without asking again
_HELD = 4096  # identities kept at most in each record (the oldest dropped first)

Key = tuple[Hashable, str]  # (filesystem key, path)


class _Known:
    """This process's records (see the module), each ``key -> (when, identity)``, oldest
    first."""

    def __init__(self) -> None:
        self.looked_up: dict[Key, tuple[float, FileIdentity]] = {}
        self.asked: dict[Key, tuple[float, FileIdentity]] = {}


_KNOWN: ProcessLocal[_Known] = ProcessLocal(_Known)
_LOCK = threading.Lock()


def _keep(
    record: dict[Key, tuple[float, FileIdentity]], key: Key, when: float, identity: FileIdentity
) -> None:
    old = record.pop(key, None)
    if old is not None and old[0] > when:  # a later answer stays
        when, identity = old
    if len(record) >= _HELD:
        del record[next(iter(record))]
    record[key] = (when, identity)


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
    with _LOCK:
        _keep(_KNOWN.get().looked_up, (fs_key, path), time.monotonic(), identity_from_info(meta))


def take_identity(fs_key: Hashable, path: str) -> tuple[float, FileIdentity] | None:
    """``(when looked up, identity)`` of ``path`` if a lookup found it in the last
    :data:`KNOWN_FOR` seconds (forgotten now: it serves one open), or None."""
    with _LOCK:
        got = _KNOWN.get().looked_up.pop((fs_key, path), None)
    if got is None or time.monotonic() - got[0] > KNOWN_FOR:
        return None
    return got


def remember_asked(fs_key: Hashable, path: str, when: float, identity: FileIdentity) -> None:
    """Keep ``identity`` of ``path``, as an open asked for it at ``when``
    (``time.monotonic()``)."""
    with _LOCK:
        _keep(_KNOWN.get().asked, (fs_key, path), when, identity)


def asked_identity(
    fs_key: Hashable, path: str, expected: FileIdentity
) -> tuple[float, FileIdentity] | None:
    """``(when asked, identity)`` of ``path`` if an open asked for it in the last
    :data:`KNOWN_FOR` seconds and it is ``expected``, else None."""
    with _LOCK:
        got = _KNOWN.get().asked.get((fs_key, path))
    if got is None or got[1] != expected or time.monotonic() - got[0] > KNOWN_FOR:
        return None
    return got
