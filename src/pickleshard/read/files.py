"""The open files of a dataset's span reads: one :class:`~pickleshard.read.SpanReader` per file
and process, opened lazily, at most ``max_open`` at once.

:class:`SpanFiles` builds a reader for a file the first time one of its samples is read in this
process, from the index's memory-mapped span arrays (no Python object per sample), over a
:class:`~pickleshard.io.LocalFile` advised for random reads (a span read wants no readahead),
with the policy's global lookup (the allowlist unless ``trusted``) and ``encoding``. A forked
child starts with no readers, so no file descriptor or cached shared object crosses a fork;
pickling leaves the readers behind. Least recently used readers are closed first (a
:class:`~pickleshard.io.lru.BudgetCache` whose budget is the count of open readers). A file whose
size changed since indexing is refused when its reader is built; each reader checks the file's
identity as the index recorded it (size, mtime, ctime, inode) on every (re)open and after every
read or batch, and holds every sample it returns to the policy's bounds (``max_sample_bytes``,
``max_depth``). ``verify = False`` turns the file checks off: only the benchmark that measures
their cost does.
"""

from __future__ import annotations

import threading
from typing import Any

from ..index import DatasetIndex
from ..io import ByteSource, open_source
from ..io.handles import ProcessLocal, WeakMethod
from ..io.lru import BudgetCache, CacheStats
from ..io.options import SourceOptions
from ..safety.policy import UnpicklePolicy
from .failures import changed
from .reader import SpanReader

__all__ = ["DEFAULT_MAX_OPEN", "SpanFiles"]

DEFAULT_MAX_OPEN = 256


def _check_size(source: ByteSource, indexed: int) -> None:
    """Refuse a file whose size changed since indexing: its spans point at other bytes now
    (rewritten, or cut short: either way the index no longer describes it)."""
    size = source.identity().size
    if size != indexed:
        raise changed(source.name, f"it is {size} bytes, {indexed} when indexed", None, None)


def _close(reader: SpanReader) -> None:
    reader.close()


class SpanFiles:
    """Per-process span readers for the files of ``index`` found at ``paths``, opened with
    ``options`` (a URL's storage options and block cache; None for local files).

    The readers live in a :class:`~pickleshard.io.lru.BudgetCache` of ``max_open`` entries (each
    reader counts 1), least recently used closed first; :attr:`stats` counts lookups that found
    a reader (hits) or built one (misses, and ``loads``: readers built in this process).
    """

    def __init__(
        self,
        index: DatasetIndex,
        paths: list[str],
        policy: UnpicklePolicy,
        max_open: int = DEFAULT_MAX_OPEN,
        options: SourceOptions | None = None,
    ) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.index = index
        self.paths = paths
        self.policy = policy
        self._max_open = max_open
        self.options = options  # what the files are opened with (a URL's storage options)
        # a forked child gets its own readers: the parent's (their fds and cached objects) stay
        # untouched in the parent; pickled, none travel
        # (self held weakly: a cycle would keep a dropped dataset's files open until a collection)
        self._readers: ProcessLocal[BudgetCache[int, SpanReader]] = ProcessLocal(
            WeakMethod(self, "_no_readers"), BudgetCache.clear
        )
        self._opening: ProcessLocal[dict[int, threading.Lock]] = ProcessLocal(dict)
        self.verify = True  # readers check framing and identity (off: the cost benchmark only)

    def _no_readers(self) -> BudgetCache[int, SpanReader]:
        return BudgetCache(self._max_open, dropped=_close)

    @property
    def max_open(self) -> int:
        """The most readers open at once in a process; set, it closes the excess at once."""
        return self._max_open

    @max_open.setter
    def max_open(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"max_open must be >= 1, got {value}")
        self._max_open = value
        readers = self._readers.peek()
        if readers is not None:
            readers.resize(value)

    @property
    def stats(self) -> CacheStats:
        """This process's counters of its readers."""
        return self._readers.get().stats

    def reader(self, pos: int) -> SpanReader:
        """The reader of file ``pos``, built on first use in this process."""
        readers = self._readers.get()
        got = readers.get(pos)
        return got if got is not None else self._open(pos, readers)

    def _open(self, pos: int, readers: BudgetCache[int, SpanReader]) -> SpanReader:
        # a Loader's threads share the readers: one opens a file, while others open other
        # files (a remote object's opening is round trips: one file at a time would add them)
        with readers.lock:
            opening = self._opening.get().setdefault(pos, threading.Lock())
        with opening:
            with readers.lock:
                got = readers.get(pos) if pos in readers else None
            return got if got is not None else self._open_locked(pos, readers)

    def _open_locked(self, pos: int, readers: BudgetCache[int, SpanReader]) -> SpanReader:
        path = self.paths[pos]
        entry = self.index.files[pos]
        # a local file (decompressed if compressed) or a URL's object
        # expecting the index's identity: an open right after the dataset's check reuses it
        source = open_source(path, self.options, entry.identity)
        source.advise("random")
        try:
            _check_size(source, entry.size)
        except BaseException:
            source.close()
            raise
        reader = SpanReader(
            self.index.scan(pos, path),
            encoding=self.policy.encoding,
            find_class=self.policy.find_class(path),
            identity=entry.identity,
            verify=self.verify,
            source=source,
            bounds=(self.policy.max_sample_bytes, self.policy.max_depth),
        )
        with readers.lock:
            readers.put(pos, reader, 1)
        return reader

    def one(self, pos: int, item: int, label: int) -> tuple[Any, ...]:
        """Sample ``item`` of file ``pos`` (in range: the caller checked), held to the
        policy's bounds, errors naming ``label``: :meth:`reader` and
        :meth:`SpanReader.one <pickleshard.read.SpanReader.one>` in one call (the reader's
        lookup inlined: this runs once per ``ds[i]``)."""
        readers = self._readers.get()
        reader = readers.get(pos)
        if reader is None:
            reader = self._open(pos, readers)
        return reader.one(item, label)

    def many(self, pos: int, items: list[int], labels: list[int]) -> list[tuple[Any, ...]]:
        """Samples ``items`` of file ``pos`` (in range and in offset order), each held to the
        policy's bounds, errors naming ``labels[k]``: :meth:`SpanReader.many
        <pickleshard.read.SpanReader.many>` of the file's reader."""
        return self.reader(pos).many(items, labels)

    def close(self) -> None:
        """Close this process's readers (counters stay); a parent's are left to the parent."""
        readers = self._readers.peek()
        if readers is not None:
            readers.clear()

    def __len__(self) -> int:
        readers = self._readers.peek()
        return 0 if readers is None else len(readers)
