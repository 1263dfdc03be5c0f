"""The span readers of a dataset's span-indexed files, one per file and process, opened lazily.

:class:`SpanFiles` builds a :class:`~pickleshard.spanread.SpanReader` for a file the first time
one of its samples is read in this process, from the index's memory-mapped span arrays (no
Python object per sample), with the policy's global lookup (the allowlist unless ``trusted``)
and ``encoding``. A forked child starts with no readers, so no file descriptor or cached shared
object crosses a fork; pickling leaves the readers behind. At most ``max_open`` readers (each
holding one file descriptor) are kept, least recently used closed first. A file whose size
changed since indexing is refused when its reader is built; each reader is given the file's
identity as the index recorded it (size, mtime, ctime, inode), which it checks with ``fstat``
on every (re)open and after every read or batch (see :class:`~pickleshard.spanread.SpanReader`).
``verify = False`` turns those checks off: only the benchmark that measures their cost does.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from .errors import CorruptPickleError, TruncatedPickleError, UnreadableFileError
from .index import DatasetIndex
from .safety import AllowlistFindClass, UnpicklePolicy
from .spanread import SpanReader

__all__ = ["DEFAULT_MAX_OPEN", "SpanFiles"]

DEFAULT_MAX_OPEN = 256


def _check_size(path: str, indexed: int) -> None:
    """Refuse a file whose size changed since indexing: its spans point at other bytes now."""
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise UnreadableFileError(path, f"cannot stat: {exc.strerror or exc}") from None
    if size < indexed:
        raise TruncatedPickleError(
            path, f"file is {size} bytes, {indexed} when indexed: cut short since", offset=size
        )
    if size != indexed:
        raise CorruptPickleError(
            path, f"file is {size} bytes, {indexed} when indexed: changed since; rebuild the index"
        )


class SpanFiles:
    """Per-process span readers for the files of ``index`` found at ``paths``."""

    def __init__(
        self,
        index: DatasetIndex,
        paths: list[str],
        policy: UnpicklePolicy,
        max_open: int = DEFAULT_MAX_OPEN,
    ) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.index = index
        self.paths = paths
        self.policy = policy
        self.max_open = max_open
        self._readers: OrderedDict[int, tuple[SpanReader, AllowlistFindClass | None]] = (
            OrderedDict()
        )
        self._pid = os.getpid()
        self.opened = 0  # readers built in this process (a counter for tests and benchmarks)
        self.verify = True  # readers check framing and identity (off: the cost benchmark only)
        self._last = -1  # the file read last

    def _reset_after_fork(self) -> None:
        if self._pid != os.getpid():
            # The parent's readers (their fds and cached objects) stay untouched in the parent.
            self._readers, self._pid, self.opened = OrderedDict(), os.getpid(), 0

    def reader(self, pos: int) -> tuple[SpanReader, AllowlistFindClass | None]:
        """The reader of file ``pos`` and its allowlist lookup (None when trusted)."""
        self._reset_after_fork()
        got = self._readers.get(pos)
        if got is not None:
            if pos != self._last:  # least recently used first out; a repeat needs no move
                self._readers.move_to_end(pos)
                self._last = pos
            return got
        path = self.paths[pos]
        entry = self.index.files[pos]
        _check_size(path, entry.size)
        find_class = self.policy.find_class(path)
        reader = SpanReader(
            self.index.scan(pos, path),
            encoding=self.policy.encoding,
            find_class=find_class,
            identity=entry.identity,
            verify=self.verify,
        )
        while len(self._readers) >= self.max_open:
            _, (old, _) = self._readers.popitem(last=False)
            old.close()
        self._readers[pos] = (reader, find_class)
        self._last = pos
        self.opened += 1
        return reader, find_class

    def read(self, pos: int, item: int, sample: int) -> tuple[Any, ...]:
        """Sample ``item`` of file ``pos``; a refused global names ``sample`` (the dataset's
        index of it) and the file."""
        reader, find_class = self.reader(pos)
        if find_class is not None:
            find_class.sample = sample
        return reader.read_sample(item)

    def close(self) -> None:
        self._reset_after_fork()
        while self._readers:
            _, (reader, _) = self._readers.popitem()
            reader.close()

    def __len__(self) -> int:
        return len(self._readers)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_readers=OrderedDict(), opened=0, _pid=-1)
        return state
