"""The byte-source protocol: the one seam between pickleshard and storage.

Everything above this layer (the scanner, the index builder, span and whole-file reads, split,
inspect, convert, verify) asks a :class:`ByteSource` for bytes by range and never learns whether
they came from a local ``pread``, an HTTP ``Range`` request or a decompressor's seek point.
A new kind of storage is one subclass and one :func:`register_source` call; it passes the shared
kit in :mod:`pickleshard.testing.sources`.

Contract of every source:

- ``name`` is what error messages call it (a path or a URL); ``size`` is fixed at open.
- ``read_at(offset, n)`` returns exactly ``min(n, size - offset)`` bytes (fewer only at the end
  of the source); a storage failure raises :class:`~pickleshard.errors.UnreadableFileError`
  naming the source and the offset. Negative offsets or lengths are a ``ValueError``.
- ``read_ranges`` reads many ``(offset, n)`` ranges at once, coalescing neighbours that lie
  within ``gap`` bytes of each other (default: the source's :meth:`ByteSource.coalesce_gap`)
  into one storage read; results come back in the order asked.
- ``identity()`` is what the source is *now* (size, and whatever the storage offers to tell a
  rewrite: mtime/ctime/inode locally, an ETag remotely); ``changed_since(recorded)`` says in
  words how it differs from an identity recorded earlier, or None.
- ``advise(pattern)`` tells the storage how the bytes will be read: ``"sequential"`` (keep
  readahead), ``"random"`` (fetch only what is asked: sparse scans and span reads) or
  ``"normal"``. It is a hint; a source may ignore it.
- ``fileno()`` is an OS descriptor the compiled core may ``pread``/``preadv`` directly, or None;
  ``map()`` a read-only buffer over the whole source (an mmap advised like the source), or None
  when the storage cannot be mapped; callers then use :class:`WindowedBuffer`.
- A source opened for a URL is given the :class:`~pickleshard.io.options.SourceOptions` of
  whoever opens it (storage options, a block cache) and keeps them: nothing is looked up in a
  process-wide table.
- A source pickles by name (and options) and reopens lazily in the process that unpickles it (a DataLoader
  worker, a pool process): no descriptor or socket crosses a fork.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

from ..errors import AlreadyRegisteredError
from .identity import FileIdentity

__all__ = [
    "COALESCE_GAP",
    "AccessPattern",
    "ByteSource",
    "coalesce",
    "register_source",
    "registered_sources",
    "source_opener",
]

AccessPattern = Literal["normal", "sequential", "random"]

COALESCE_GAP = 4096  # bytes between two ranges read as one (a page: a gap costs nothing locally)


class ByteSource(ABC):
    """A fixed-size sequence of bytes read by range (see the module docstring's contract)."""

    #: the scheme this class serves (``"file"``), the key of :func:`register_source`
    protocol: ClassVar[str]

    name: str

    @property
    @abstractmethod
    def size(self) -> int:
        """The source's length in bytes, fixed when it was opened."""

    @abstractmethod
    def readinto_at(self, offset: int, view: memoryview) -> int:
        """Fill ``view`` from ``offset``; return the bytes written (fewer only at the end)."""

    @abstractmethod
    def identity(self) -> FileIdentity:
        """What the source is now: its size and the storage's stamps of a rewrite."""

    @abstractmethod
    def close(self) -> None:
        """Release descriptors, maps and connections; reads after close reopen."""

    def read_at(self, offset: int, n: int) -> bytes:
        """Exactly ``min(n, size - offset)`` bytes at ``offset`` (``b""`` past the end)."""
        _check_range(offset, n)
        n = max(0, min(n, self.size - offset))
        out = bytearray(n)
        got = self.readinto_at(offset, memoryview(out)) if n else 0
        return bytes(out) if got == n else bytes(out[:got])

    def read_ranges(self, ranges: Sequence[tuple[int, int]], gap: int | None = None) -> list[bytes]:
        """The bytes of each ``(offset, n)`` of ``ranges``, in that order; neighbours within
        ``gap`` bytes of each other (None: :meth:`coalesce_gap`, what a request costs on this
        storage) are fetched by one read and sliced apart."""
        for offset, n in ranges:
            _check_range(offset, n)
        blocks = coalesce(ranges, self.coalesce_gap() if gap is None else gap)
        out: list[bytes] = [b""] * len(ranges)
        for (lo, _, members), block in zip(blocks, self.read_blocks(blocks), strict=True):
            for m in members:
                offset, n = ranges[m]
                out[m] = block[offset - lo : offset - lo + n]
        return out

    def read_blocks(self, blocks: Sequence[tuple[int, int, list[int]]]) -> list[bytes]:
        """The bytes of each coalesced ``(lo, hi, _)`` block, one :meth:`read_at` each; a
        source that can fetch many at once (concurrently) overrides this."""
        return [self.read_at(lo, hi - lo) for lo, hi, _ in blocks]

    def coalesce_gap(self) -> int:
        """Bytes between two ranges that cost less to read through than a second request: a
        page here (:data:`COALESCE_GAP`); a remote source sizes it from its link's latency and
        bandwidth."""
        return COALESCE_GAP

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:  # noqa: B027 - a hint
        """Hint: the ``(offset, n)`` ranges are about to be read (a batch's samples); a remote
        source fetches them together, the default does nothing."""

    def changed_since(self, recorded: FileIdentity) -> str | None:
        """How the source now differs from ``recorded`` (in words), or None."""
        return recorded.differs_from(self.identity())

    def advise(self, pattern: AccessPattern) -> None:  # noqa: B027 - a hint: no-op by default
        """Tell the storage how the next reads go; the default ignores the hint."""

    def expect(self, identity: FileIdentity) -> None:  # noqa: B027 - a hint: no-op by default
        """Hint, before the first read: the source should be ``identity`` (an index's record of
        it; checked as ever); a remote source may then skip asking for what an open of that
        very version just asked. The default ignores the hint."""

    def fileno(self) -> int | None:
        """A descriptor the compiled core may ``pread`` directly, or None."""
        return None

    def map(self) -> Any | None:
        """A read-only buffer over the whole source, or None when it cannot be mapped."""
        return None

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def coalesce(
    ranges: Sequence[tuple[int, int]], gap: int = COALESCE_GAP, overread: int | None = None
) -> list[tuple[int, int, list[int]]]:
    """``ranges`` merged into blocks ``(lo, hi, members)`` in offset order: neighbours within
    ``gap`` bytes of each other share one block; ``members`` are their positions in ``ranges``.

    ``overread`` (None: no limit) caps the bytes read through in gaps wider than a page
    (:data:`COALESCE_GAP`): the narrowest are bridged first, so a byte budget buys the most
    requests saved. Ranges within a page of each other always share a block (free to bridge)."""
    order = sorted(range(len(ranges)), key=lambda k: ranges[k][0])
    if not order:
        return []
    # the gap after each range (sorted) to the next; bridged where it fits the gap (and budget)
    ends: list[int] = []
    gaps: list[int] = []
    hi = -1
    for k in order:
        lo, n = ranges[k]
        if ends:
            gaps.append(lo - hi)
        hi = max(hi, lo + n)
        ends.append(hi)
    bridge = [g <= gap for g in gaps]
    if overread is not None:
        spend = overread
        wide = (j for j, g in enumerate(gaps) if COALESCE_GAP < g <= gap)
        for j in sorted(wide, key=gaps.__getitem__):
            bridge[j] = gaps[j] <= spend
            spend -= gaps[j] if bridge[j] else 0
    blocks: list[tuple[int, int, list[int]]] = []
    first = 0
    for j in range(len(order)):
        if j == len(order) - 1 or not bridge[j]:
            members = order[first : j + 1]
            blocks.append((ranges[order[first]][0], ends[j], members))
            first = j + 1
    return blocks


def _check_range(offset: int, n: int) -> None:
    if offset < 0 or n < 0:
        raise ValueError(f"a byte range needs offset >= 0 and length >= 0, got ({offset}, {n})")


# opener(path); a URL's opener given SourceOptions is called opener(url, options) (open_source)
_REGISTRY: dict[str, Callable[..., ByteSource]] = {}


def register_source(
    protocol: str, opener: Callable[[str], ByteSource], *, clobber: bool = False
) -> None:
    """Make ``open_source("PROTOCOL://...")`` call ``opener(url)``; a plain path is ``"file"``.

    Registering the same opener again does nothing; another opener for a protocol already
    taken raises :class:`~pickleshard.errors.AlreadyRegisteredError` unless ``clobber=True``
    (as :func:`pickleshard.formats.register_format`): a silent replacement would change how
    every later URL of that scheme is read.
    """
    held = _REGISTRY.get(protocol)
    if held is not None and held is not opener and not clobber:
        raise AlreadyRegisteredError("byte source", protocol, _name_of(held))
    _REGISTRY[protocol] = opener


def _name_of(opener: Callable[[str], ByteSource]) -> str:
    module = getattr(opener, "__module__", None)
    qualname = getattr(opener, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else repr(opener)


def source_opener(protocol: str) -> Callable[..., ByteSource] | None:
    """The opener registered for ``protocol`` (``"file"`` for a plain path), if any."""
    return _REGISTRY.get(protocol)


def registered_sources() -> tuple[str, ...]:
    """The protocols :func:`open_source` knows, sorted."""
    return tuple(sorted(_REGISTRY))
