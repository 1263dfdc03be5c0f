"""Remote objects read by byte range through fsspec: ``s3://``, ``gs://``, ``http(s)://``...

:class:`FsspecSource` is a :class:`~pickleshard.io.ByteSource` over one object of any fsspec
filesystem. Every read is a ranged request (``fs.cat_file(path, start, end)``); the blocks of
:meth:`~pickleshard.io.ByteSource.read_ranges` go out together through ``fs.cat_ranges``
(concurrent on the async filesystems: s3fs, gcsfs, HTTP). It cannot be mapped and has no
descriptor, so scans and reads take their range-read paths.

A source is constructed with its :class:`~pickleshard.io.options.SourceOptions`: the storage
options (credentials, endpoint, ...: the keyword pandas, Dask and HF datasets use) of whoever
opened it (``PickleDataset(url, storage_options=...)``, the CLI's ``--storage-option``), and the
block cache it shares with the other sources opened with the same options; without options
fsspec's own configuration applies (``~/.aws``, environment variables) and nothing is cached.
Options travel with a pickled source (to a DataLoader worker, in memory) and are never written
to an index, a log, an error or a repr.

Each process opens its own filesystem (cached by process id, protocol and options): nothing
holding a socket crosses a fork. A dropped connection, a timeout or a 5xx is retried
``retries`` times with exponential backoff; then :class:`~pickleshard.errors.RemoteStorageError`
names the URL and the byte range. A refusal (403, bad credentials) is raised at once, as one
:class:`~pickleshard.errors.RemoteStorageError` saying so.

A read of more than :data:`DOWNLOAD_WINDOW` bytes (a scan's dense file, a whole-file load) is
fetched like a download: in windows of 8-16 MiB, :data:`IN_FLIGHT` requests at once, each written
into place as it arrives; these batches, and any other read of as many bytes, hold their bytes
in this process's budget (:mod:`~pickleshard.io.remote.inflight`: several files downloaded at
once stay under it).
The first read inside an object's head (its first 1/256, within 16-64 KiB: :func:`head_bytes`)
fetches it all and keeps it: the sniff for compression, a producer's header check, the
fingerprint's first block and a scan's first windows (enough of them to tell a dense file) are
then one round trip, not one each (at most 64 KiB held per open object: 16 MiB for a reader
pool's 256). Every fetch is timed into the store's
:class:`~pickleshard.io.remote.link.LinkEstimate`, from which
:meth:`FsspecSource.coalesce_gap` says how far apart two ranges are worth one request;
:attr:`FsspecSource.counters` counts this process's requests, bytes and seconds waiting for
them.

``identity()`` is the object's size, ETag and last-modified time (fsspec's ``info``, asked again
once the one seen is ``identity_ttl`` seconds old, and ahead of that in the background
(:mod:`~pickleshard.io.remote.seen`): a read path checks identity after every batch, and one
metadata request per batch would double the round trips). An open takes the identity that
resolving the URL has just looked up, or, told what to expect (:meth:`FsspecSource.expect`: a
reader, the index's record), the one an open of that version just asked for
(:mod:`~pickleshard.io.remote.known`), counted from when it was asked, instead of asking again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

from ...errors import RemoteStorageError, UnreadableFileError
from ..base import ByteSource, _check_range, coalesce, register_source
from ..handles import ProcessLocal
from ..identity import FileIdentity
from ..options import SourceOptions
from .counting import RemoteCounters
from .filesystems import filesystem, filesystem_key, is_url
from .inflight import in_flight_bytes
from .known import (
    asked_identity,
    identity_from_info,
    remember_asked,
    take_identity,
)
from .link import LinkEstimate, link_for
from .seen import SeenIdentity
from .staging import staged_ranges

__all__ = [
    "PROTOCOLS",
    "FsspecSource",
    "filesystem",
    "filesystem_key",
    "is_url",
]

# the protocols registered with open_source (any other fsspec one: register_source(p, FsspecSource))
PROTOCOLS = ("s3", "s3a", "gs", "gcs", "http", "https", "memory", "az", "abfs", "abfss", "hf")

T = TypeVar("T")

RETRIES = 5  # tries after the first, by default
BACKOFF = 0.1  # seconds before the first retry, doubled each time
OVERREAD = 0.4  # a prefetch reads through gaps of at most this share of its ranges' bytes
DOWNLOAD_WINDOW = 8 << 20  # a read longer than this goes out as windows of 8-16 MiB...
MAX_WINDOW = 16 << 20
IN_FLIGHT = 8  # ...this many requested at once (memory in flight: IN_FLIGHT * window)
HEAD_BYTES = 64 << 10  # the first read inside an object's head fetches (and keeps) it all...
HEAD_MIN = 16 << 10  # ...the head: 1/256 of the object, within these bounds (head_bytes)


def _refused(exc: BaseException) -> bool:
    """A refusal no retry changes: permission, credentials, a missing object, a 4xx."""
    if isinstance(exc, (PermissionError, FileNotFoundError, ValueError, TypeError)):
        return True
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    return isinstance(status, int) and 400 <= status < 500


class _Connection:
    """A remote object as one process sees it: its filesystem and path there, its identity
    when opened, the identity last seen (:class:`~pickleshard.io.remote.seen.SeenIdentity`),
    the key of its staged ranges and its head (:func:`head_bytes`) once a read fetched it."""

    __slots__ = ("fs", "fs_key", "head", "key", "opened", "path", "seen")

    def __init__(self, fs: Any, fs_key: Any, path: str, url: str, seen: SeenIdentity) -> None:
        self.fs, self.fs_key, self.path, self.opened = fs, fs_key, path, seen.seen[1]
        self.seen = seen
        self.head: bytes | None = None
        self.key = f"{url}#{self.opened.etag}#{self.opened.size}"  # one version of the object


class FsspecSource(ByteSource):
    """One object of an fsspec filesystem, read by range (see the module docstring).

    ``options`` (None: fsspec's own configuration, no block cache) give the filesystem its
    storage options and the reads their block cache; ``retries`` and ``backoff`` (seconds, doubled each try; default :data:`RETRIES` and
    :data:`BACKOFF`) govern retries of transient failures; ``identity_ttl`` how long an identity is reused (0: a metadata request each time).
    """

    protocol = "fsspec"

    def __init__(
        self,
        url: str,
        options: SourceOptions | None = None,
        *,
        retries: int | None = None,
        backoff: float | None = None,
        identity_ttl: float = 1.0,
    ) -> None:
        retries = RETRIES if retries is None else retries
        backoff = BACKOFF if backoff is None else backoff
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.name = self.url = url
        self.options = options if options is not None else SourceOptions()
        self.retries, self.backoff, self.identity_ttl = retries, backoff, identity_ttl
        self.counters = RemoteCounters()  # this process's requests, since it connected
        self._hold_whole = False  # hold_whole(): not carried by pickling
        self._expected: FileIdentity | None = None  # expect(): nor this
        self._connection = ProcessLocal(self._connect)

    # -- the filesystem and the object's metadata --------------------------------------------
    def _connect(self) -> _Connection:
        fs, path = filesystem(self.url, self.options.storage_options)
        fs_key = filesystem_key(self.url, self.options.storage_options)
        self.counters = RemoteCounters()
        # the identity another open just asked for, if expected; else the one resolving the
        # URL just looked up; else one request. It counts as seen when it was asked for:
        # identity() asks again once that is too old
        expected = self._expected
        seen = None if expected is None else asked_identity(fs_key, path, expected)
        seen = seen or take_identity(fs_key, path)
        if seen is None:
            asked = time.monotonic()
            seen = (asked, self._stat(fs, path))
        remember_asked(fs_key, path, *seen)

        def answered(when: float, identity: FileIdentity) -> None:
            remember_asked(fs_key, path, when, identity)

        ask = SeenIdentity(seen, lambda: self._stat(fs, path), answered)
        return _Connection(fs, fs_key, path, self.url, ask)

    def expect(self, identity: FileIdentity) -> None:
        """Hint, before the first read: the object should be ``identity`` (the index's record
        of it); the open may then take what an open of that version just asked for
        (:mod:`~pickleshard.io.remote.known`) instead of asking again."""
        self._expected = identity

    def _stat(self, fs: Any, path: str) -> FileIdentity:
        def info() -> dict[str, Any]:
            fs.invalidate_cache(path)  # a listing's entry may be older
            got: dict[str, Any] = fs.info(path)
            return got

        meta = self._retried(info, "cannot get the object's metadata", None)
        if meta.get("type", "file") != "file":
            raise UnreadableFileError(self.url, f"is a {meta.get('type')}, not an object")
        return identity_from_info(meta)

    @property
    def size(self) -> int:
        return self._connection.get().opened.size

    def identity(self) -> FileIdentity:
        return self._connection.get().seen.current(self.identity_ttl)

    def close(self) -> None:
        self._connection.close()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "options": self.options,
            "retries": self.retries,
            "backoff": self.backoff,
            "identity_ttl": self.identity_ttl,
        }  # no connection, no staged or cached bytes

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["url"],
            state["options"],
            retries=state["retries"],
            backoff=state["backoff"],
            identity_ttl=state["identity_ttl"],
        )

    # -- reads -----------------------------------------------------------------------------
    def _retried(self, call: Callable[[], T], what: str, span: tuple[int, int] | None) -> T:
        """``call()``, retried on transient failures; the error names the URL and ``span``."""
        where = "" if span is None else f" (bytes {span[0]}-{span[1]})"
        for attempt in range(self.retries + 1):
            try:
                return call()
            except Exception as exc:
                if isinstance(exc, (PermissionError,)) or getattr(exc, "status", 0) in (401, 403):
                    raise RemoteStorageError(
                        self.url,
                        f"access denied{where}: {_short(exc)}; check the credentials "
                        "(storage_options or the fsspec/boto configuration)",
                        offset=None if span is None else span[0],
                    ) from None
                if isinstance(exc, FileNotFoundError):
                    raise UnreadableFileError(self.url, f"no such object: {_short(exc)}") from None
                if _refused(exc):
                    raise RemoteStorageError(
                        self.url,
                        f"{what}{where}: {_short(exc)}",
                        offset=None if span is None else span[0],
                    ) from None
                if attempt == self.retries:
                    raise RemoteStorageError(
                        self.url,
                        f"{what}{where} after {self.retries + 1} tries: {_short(exc)}",
                        offset=None if span is None else span[0],
                    ) from None
                time.sleep(self.backoff * (2**attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def link(self) -> LinkEstimate:
        """This process's estimate of the store's latency and bandwidth (shared by its objects)."""
        return link_for(self.url)

    def coalesce_gap(self) -> int:
        """Bytes between two ranges cheaper to fetch than a second request: the store's
        ``latency * bandwidth`` as measured (:meth:`LinkEstimate.gap`)."""
        return self.link.gap()

    def _fetch(
        self, spans: Sequence[tuple[int, int]], asked: tuple[int, int] | None = None
    ) -> list[bytes]:
        """The bytes of each ``(lo, hi)`` (within the object), all requested at once; an error
        names ``asked`` (the range a caller read, where it lies inside the one fetched)."""
        here = self._connection.get()
        t0 = time.perf_counter()
        if len(spans) == 1:
            lo, hi = spans[0]
            data = self._retried(
                lambda: here.fs.cat_file(here.path, start=lo, end=hi),
                "cannot read",
                asked or (lo, hi),
            )
            out = [data]
        else:
            out = self._retried(lambda: self._cat_ranges(here, spans), "cannot read", _cover(spans))
        seconds = time.perf_counter() - t0
        got = sum(len(d) for d in out)
        self.counters.add(len(spans), got, seconds)
        self.link.observe(len(spans), got, seconds)
        for (lo, hi), d in zip(spans, out, strict=True):
            if len(d) != hi - lo:
                raise RemoteStorageError(
                    self.url,
                    f"bytes {lo}-{hi}: the store sent {len(d)} bytes for {hi - lo} asked "
                    "(the object changed since it was opened?)",
                    offset=lo,
                )
        return out

    def _cat_ranges(self, here: _Connection, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        got = here.fs.cat_ranges(
            [here.path] * len(spans),
            [lo for lo, _ in spans],
            [hi for _, hi in spans],
            on_error="return",
        )
        for item in got:
            if isinstance(item, BaseException):
                raise item
        return list(got)

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch the ``(offset, n)`` ranges not staged yet, together, and stage them
        (:mod:`~pickleshard.io.remote.staging`): the first read inside a staged range takes its
        bytes from there. Neighbours within :meth:`coalesce_gap` share one request, the
        narrowest gaps first, reading through at most :data:`OVERREAD` of the ranges' bytes
        (gaps of a page are free);
        the requests go out at once (:meth:`read_blocks`)."""
        here = self._connection.get()
        stage = staged_ranges()
        size = here.opened.size
        wanted = [
            (lo, min(n, size - lo))
            for lo, n in ranges
            if n > 0 and lo < size and not stage.holds(here.key, lo, min(n, size - lo))
        ]
        if not wanted or sum(n for _, n in wanted) > stage.budget // 2:
            return  # nothing to fetch, or more than the stage would keep: read as asked
        overread = int(OVERREAD * sum(n for _, n in wanted))
        blocks = coalesce(wanted, self.coalesce_gap(), overread)
        fetched = self._read([(lo, hi) for lo, hi, _ in blocks], staged=False)
        stage.put(
            here.key,
            (
                (wanted[m][0], block[wanted[m][0] - lo : wanted[m][0] - lo + wanted[m][1]])
                for (lo, _, members), block in zip(blocks, fetched, strict=True)
                for m in members
            ),
        )

    def _read(self, spans: Sequence[tuple[int, int]], staged: bool = True) -> list[bytes]:
        """Bytes of ``spans`` (clipped to the object): a staged range's (when ``staged``),
        else through the block cache if one is set, else fetched at once."""
        here = self._connection.get()
        size = here.opened.size
        spans = [(min(lo, size), min(hi, size)) for lo, hi in spans]
        if staged and len(spans) == 1:
            got = staged_ranges().take(here.key, *spans[0])
            if got is not None:
                return [got]
        out = [self._in_head(here, lo, hi) for lo, hi in spans]
        wanted = [s for s, got in zip(spans, out, strict=True) if got is None and s[1] > s[0]]
        cache = self.options.block_cache
        if cache is None:
            total = sum(hi - lo for lo, hi in wanted)  # a large read holds the budget in flight
            with in_flight_bytes().hold(total) if total >= DOWNLOAD_WINDOW else nullcontext():
                got_wanted = self._fetch(wanted) if wanted else []
        else:
            got_wanted = [cache.read(here.key, size, lo, hi - lo, self._fetch) for lo, hi in wanted]
        if self._hold_whole and (0, size) in wanted:  # the whole object: later reads take it
            here.head = got_wanted[wanted.index((0, size))]
        fetched = iter(got_wanted)
        return [
            got if got is not None else next(fetched) if hi > lo else b""
            for (lo, hi), got in zip(spans, out, strict=True)
        ]

    def _in_head(self, here: _Connection, lo: int, hi: int) -> bytes | None:
        """Bytes ``[lo, hi)`` from the object's head (fetched whole by the first read inside
        it; the whole object after :meth:`hold_whole`), or None for a read that ends past it."""
        head = here.head
        if head is None:
            if hi > head_bytes(here.opened.size) or hi <= lo:
                return None
            head = self._fetch([(0, head_bytes(here.opened.size))], (lo, hi))[0]
            here.head = head
        return head[lo:hi] if lo < hi <= len(head) else None

    def hold_whole(self) -> None:
        """From now on, once a read has fetched the whole object, keep its bytes (until
        :meth:`close`) and serve the later reads from them: an index build's fingerprint after
        a dense file's download costs no request. (A reader pool never asks: it would hold
        every file it downloads.)"""
        self._hold_whole = True

    def readinto_at(self, offset: int, view: memoryview) -> int:
        _check_range(offset, len(view))
        n = max(0, min(len(view), self.size - offset))
        here = self._connection.get()
        staged = staged_ranges().take(here.key, offset, offset + n) if n else None
        if staged is None and n > DOWNLOAD_WINDOW and self.options.block_cache is None:
            return self._download(offset, view[:n])
        data = self.read_at(offset, n) if staged is None else staged
        view[: len(data)] = data
        return len(data)

    def _download(self, offset: int, view: memoryview) -> int:
        """Fill ``view`` from ``offset`` as a download: windows of ``len(view) / IN_FLIGHT``
        (8-16 MiB), :data:`IN_FLIGHT` requested at once, each copied into place on arrival."""
        end = offset + len(view)
        head = self._connection.get().head or b""
        start = max(offset, min(len(head), end))  # what the head holds is not fetched again
        view[: start - offset] = head[offset:start]
        window = min(MAX_WINDOW, max(DOWNLOAD_WINDOW, -(-(end - start) // IN_FLIGHT)))
        spans = [(lo, min(lo + window, end)) for lo in range(start, end, window)]
        for k in range(0, len(spans), IN_FLIGHT):
            batch = spans[k : k + IN_FLIGHT]
            with in_flight_bytes().hold(sum(hi - lo for lo, hi in batch)):
                for (lo, hi), data in zip(batch, self._fetch(batch), strict=True):
                    view[lo - offset : hi - offset] = data
        return len(view)

    def read_at(self, offset: int, n: int) -> bytes:
        _check_range(offset, n)
        if n <= DOWNLOAD_WINDOW or self.options.block_cache is not None:
            return self._read([(offset, offset + n)])[0]
        out = bytearray(max(0, min(n, self.size - offset)))
        self.readinto_at(offset, memoryview(out))
        return bytes(out)

    def read_blocks(self, blocks: Sequence[tuple[int, int, list[int]]]) -> list[bytes]:
        return self._read([(lo, hi) for lo, hi, _ in blocks])

    def __repr__(self) -> str:  # the URL only: options may hold credentials
        return f"FsspecSource({self.url!r})"


def head_bytes(size: int) -> int:
    """The bytes of an object of ``size`` bytes its first read fetches: 1/256 of it, at least
    :data:`HEAD_MIN` (a sniff, a header, the first samples' opcodes) and at most
    :data:`HEAD_BYTES`; a few percent of a small object's bytes, a fraction of one of a large one's."""
    return min(size, HEAD_BYTES, max(HEAD_MIN, size >> 8))


def _cover(spans: Sequence[tuple[int, int]]) -> tuple[int, int]:
    return min(lo for lo, _ in spans), max(hi for _, hi in spans)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


for _protocol in PROTOCOLS:
    register_source(_protocol, FsspecSource)
