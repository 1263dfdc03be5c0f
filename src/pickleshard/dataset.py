"""``PickleDataset``: a map-style dataset over a folder of pickle files.

It needs no import of torch: ``torch.utils.data.DataLoader`` accepts any object with
``__len__`` and ``__getitem__``, and calls ``__getitems__`` for a whole batch when present.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

try:  # a real torch Dataset when torch is there (isinstance checks, typing); plain class if not
    from torch.utils.data import Dataset as _DatasetBase
except ImportError:  # pragma: no cover - exercised only without torch
    _DatasetBase = object  # type: ignore[assignment,misc]

from .index import Rebuild, open_index
from .layouts import DecodedLayout
from .safety import UnpicklePolicy
from .sources import Source
from .wholefile import CacheStats, WholeFileCache, load_layout

__all__ = ["DEFAULT_CACHE_BYTES", "PickleDataset"]

DEFAULT_CACHE_BYTES = 1 << 30

Sample = tuple[Any, ...]


def _worker_count() -> int:
    """Number of DataLoader workers when called inside one, else 1 (torch imported only if loaded)."""
    data = sys.modules.get("torch.utils.data")
    if data is None:
        return 1
    info = data.get_worker_info()
    return 1 if info is None else int(info.num_workers)


class PickleDataset(_DatasetBase[Any]):
    """Samples of every pickle file under ``source``, by global index.

    ``source`` is a directory (searched recursively for ``*.pkl``, ``*.pickle``, ``*.pk``,
    ``*.p``), a glob, or a list of files. The index is opened from ``index`` (default
    ``DIR/.pickleshard``), built when missing, and checked against the files: see
    :func:`pickleshard.open_index` for ``rebuild``.

    ``ds[i]`` returns a tuple with one element per field, ``(x, y)`` for the common layout;
    ``transform``, if given, is applied to that tuple.

    Unpickling is restricted to an allowlist of globals (builtin containers, numpy arrays,
    torch tensors; see :mod:`pickleshard.safety`): anything else raises
    :class:`~pickleshard.errors.UnsafePickleError`. ``trusted=True`` lifts the restriction,
    ``allow_globals=["module.name"]`` extends it. ``encoding`` is as in :func:`pickle.load`.

    ``__getitems__`` fetches a batch, touching
    each file once.

    Whole-file mode keeps decoded files in an LRU cache bounded by ``cache_bytes`` of estimated
    decoded size, *in total across DataLoader workers*: each of ``n`` workers gets
    ``cache_bytes // n``. Each process has its own cache (a forked worker starts empty). Pair it
    with :class:`pickleshard.BlockShuffleSampler` to shuffle without reloading files.
    """

    def __init__(
        self,
        source: Source,
        *,
        index: str | os.PathLike[str] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        rebuild: Rebuild = "missing",
        transform: Callable[[Sample], Any] | None = None,
        trusted: bool = False,
        allow_globals: Iterable[str] = (),
        encoding: str = "ASCII",
        jobs: int | None = None,
        progress: bool = False,
    ) -> None:
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
        self.policy = UnpicklePolicy.from_args(
            trusted=trusted, allow_globals=allow_globals, encoding=encoding
        )
        self.index, self.source = open_index(
            source, index=index, rebuild=rebuild, jobs=jobs, progress=progress, policy=self.policy
        )
        self.cache_bytes = cache_bytes
        self.transform = transform
        self._paths = [os.fspath(self.source.absolute(f.path)) for f in self.index.files]
        self._cache: WholeFileCache | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        return self.index.fields

    def __len__(self) -> int:
        return self.index.num_samples

    def _load(self, path: str) -> DecodedLayout:
        return load_layout(path, self.policy)

    @property
    def cache(self) -> WholeFileCache:
        """This process's whole-file cache, created on first use with its share of the budget."""
        if self._cache is None or self._cache._pid != os.getpid():
            self._cache = WholeFileCache(self.cache_bytes // _worker_count(), self._load)
        return self._cache

    @property
    def cache_stats(self) -> CacheStats:
        return self.cache.stats

    def _check(self, i: int) -> int:
        n = len(self)
        j = int(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"sample index {i} out of range for a dataset of {n} samples")
        return j

    def _file(self, pos: int) -> DecodedLayout:
        return self.cache.get(self._paths[pos], self.index.files[pos].decoded_nbytes)

    def _finish(self, sample: Sample) -> Any:
        return sample if self.transform is None else self.transform(sample)

    def __getitem__(self, i: int) -> Any:
        pos, item = self.index.locate(self._check(i))
        columns = self._file(pos).columns
        return self._finish(tuple(col[item] for col in columns))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Fetch a batch; files are visited in order of first appearance, each once."""
        rows = self.index.samples[np.fromiter((self._check(i) for i in indices), dtype=np.int64)]
        files, items = rows["file"], rows["item"]
        uniq, first = np.unique(files, return_index=True)
        out: list[Any] = [None] * len(rows)
        for pos in uniq[np.argsort(first)]:
            columns = self._file(int(pos)).columns
            for k in np.flatnonzero(files == pos):
                item = int(items[k])
                out[k] = self._finish(tuple(col[item] for col in columns))
        return out

    def __getstate__(self) -> dict[str, Any]:
        # Spawned workers reopen the index by path; the cache never travels.
        state = self.__dict__.copy()
        state["_cache"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"PickleDataset({os.fspath(self.source.root)!r}, files={len(self._paths)}, "
            f"samples={len(self)}, fields={self.fields})"
        )
