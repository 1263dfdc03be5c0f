"""The open files of a dataset's span reads: one :class:`~pickleshard.read.SpanReader` per file
and process, opened lazily, at most ``max_open`` at once.

:class:`SpanFiles` builds a reader for a file the first time one of its samples is read in this
process, from the index's memory-mapped span arrays (no Python object per sample), over a
:class:`~pickleshard.io.LocalFile` advised for random reads (a span read wants no readahead),
with the policy's global lookup (the allowlist unless ``trusted``) and ``encoding``. A forked
child starts with no readers, so no file descriptor or cached shared object crosses a fork;
pickling leaves the readers behind. Least recently used readers are closed first. A file whose
size changed since indexing is refused when its reader is built; each reader checks the file's
identity as the index recorded it (size, mtime, ctime, inode) on every (re)open and after every
read or batch, and holds every sample it returns to the policy's bounds (``max_sample_bytes``,
``max_depth``). ``verify = False`` turns the file checks off: only the benchmark that measures
their cost does.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ..errors import CorruptPickleError, TruncatedPickleError
from ..index import DatasetIndex
from ..io import ByteSource, open_source
from ..io.options import SourceOptions
from ..safety.policy import UnpicklePolicy
from .plan import FORKS
from .reader import SpanReader

__all__ = ["DEFAULT_MAX_OPEN", "SpanFiles"]

DEFAULT_MAX_OPEN = 256


def _check_size(source: ByteSource, indexed: int) -> None:
    """Refuse a file whose size changed since indexing: its spans point at other bytes now."""
    size = source.identity().size
    if size < indexed:
        raise TruncatedPickleError(
            source.name,
            f"file is {size} bytes, {indexed} when indexed: cut short since",
            offset=size,
        )
    if size != indexed:
        raise CorruptPickleError(
            source.name,
            f"file is {size} bytes, {indexed} when indexed: changed since; rebuild the index",
        )


class SpanFiles:
    """Per-process span readers for the files of ``index`` found at ``paths``, opened with
    ``options`` (a URL's storage options and block cache; None for local files)."""

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
        self.max_open = max_open
        self.options = options  # what the files are opened with (a URL's storage options)
        self._readers: OrderedDict[int, SpanReader] = OrderedDict()
        self._gen = FORKS[0]  # the process (fork) whose readers these are
        self.opened = 0  # readers built in this process (a counter for tests and benchmarks)
        self.verify = True  # readers check framing and identity (off: the cost benchmark only)
        self._last = -1  # the file read last

    def reader(self, pos: int) -> SpanReader:
        """The reader of file ``pos``, built on first use in this process."""
        if self._gen != FORKS[0]:
            # The parent's readers (their fds and cached objects) stay untouched in the parent.
            self._readers, self._gen, self.opened = OrderedDict(), FORKS[0], 0
        got = self._readers.get(pos)
        if got is not None:
            if pos != self._last:  # least recently used first out; a repeat needs no move
                self._readers.move_to_end(pos)
                self._last = pos
            return got
        path = self.paths[pos]
        entry = self.index.files[pos]
        # a local file (decompressed if compressed) or a URL's object
        source = open_source(path, self.options)
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
        while len(self._readers) >= self.max_open:
            _, old = self._readers.popitem(last=False)
            old.close()
        self._readers[pos] = reader
        self._last = pos
        self.opened += 1
        return reader

    def one(self, pos: int, item: int, label: int) -> tuple[Any, ...]:
        """Sample ``item`` of file ``pos`` (in range: the caller checked), held to the
        policy's bounds, errors naming ``label``: :meth:`reader` and
        :meth:`SpanReader.one <pickleshard.read.SpanReader.one>` in one call (the reader's
        lookup inlined: this runs once per ``ds[i]``)."""
        reader = self._readers.get(pos) if self._gen == FORKS[0] else None
        if reader is None:
            reader = self.reader(pos)
        elif pos != self._last:
            self._readers.move_to_end(pos)
            self._last = pos
        return reader.one(item, label)

    def many(self, pos: int, items: list[int], labels: list[int]) -> list[tuple[Any, ...]]:
        """Samples ``items`` of file ``pos`` (in range and in offset order), each held to the
        policy's bounds, errors naming ``labels[k]``: :meth:`SpanReader.many
        <pickleshard.read.SpanReader.many>` of the file's reader."""
        return self.reader(pos).many(items, labels)

    def close(self) -> None:
        if self._gen != FORKS[0]:
            self._readers, self._gen, self.opened = OrderedDict(), FORKS[0], 0
        while self._readers:
            _, reader = self._readers.popitem()
            reader.close()

    def __len__(self) -> int:
        return len(self._readers)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_readers=OrderedDict(), opened=0, _gen=-1)
        return state
