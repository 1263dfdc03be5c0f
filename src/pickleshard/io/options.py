"""What opening a source takes besides its name: the storage options of its URL and the block
cache its remote reads share.

A :class:`SourceOptions` belongs to whoever opens sources (a dataset, an index build, a convert
or verify job, the CLI) and is handed down to every :func:`~pickleshard.io.open_source` call
made for it: nothing is registered process-wide, so two datasets on one bucket with different
credentials each read with their own. It pickles with its owner (to a DataLoader worker, a pool
process or a Dask task: credentials included, the worker needs them to read the data), and is
never written to an index, a log, an error or a repr. Local paths ignore it.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from .handles import ProcessLocal
from .remote.blocks import DEFAULT_BLOCK_SIZE, BlockCache

__all__ = ["SourceOptions", "source_options"]


class SourceOptions:
    """``storage_options`` go to the fsspec filesystem of every URL opened with these options
    (credentials, ``endpoint_url``, ``profile``...: the keyword pandas, Dask and HF datasets
    use; empty: fsspec's own configuration, ``~/.aws``, environment variables).

    ``block_cache_bytes`` (None: no cache, the default) keeps fetched blocks of ``block_size``
    bytes in one LRU shared by every remote source opened with these options in one process:
    at most ``block_cache_bytes`` bytes per process (a forked or spawned worker starts its own,
    empty). :attr:`block_cache` is this process's cache; its ``stats`` count hits, misses
    and bytes fetched.
    """

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None = None,
        *,
        block_cache_bytes: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        self.storage_options: dict[str, Any] = dict(storage_options or {})
        self.block_cache_bytes = block_cache_bytes
        self.block_size = block_size
        self._blocks: ProcessLocal[BlockCache] | None = None
        if block_cache_bytes is not None:
            BlockCache(block_cache_bytes, block_size)  # a bad budget fails here, not at a read
            self._blocks = ProcessLocal(partial(BlockCache, block_cache_bytes, block_size))

    @property
    def block_cache(self) -> BlockCache | None:
        """This process's block cache (created on first use), or None when there is none."""
        return None if self._blocks is None else self._blocks.get()

    def __repr__(self) -> str:  # option names only: their values may be credentials
        names = ", ".join(sorted(self.storage_options))
        return (
            f"SourceOptions(storage_options=<{names or 'none'}>, "
            f"block_cache_bytes={self.block_cache_bytes})"
        )


def source_options(
    given: Mapping[str, Any] | SourceOptions | None, block_cache_bytes: int | None = None
) -> SourceOptions | None:
    """What a public function's ``storage_options`` argument means: a mapping of fsspec
    options is wrapped (with a block cache of ``block_cache_bytes`` when given),
    :class:`SourceOptions` is taken as it is (it brings its own block cache: a
    ``block_cache_bytes`` beside it is a ``ValueError``), None without a cache is None."""
    if isinstance(given, SourceOptions):
        if block_cache_bytes is not None:
            raise ValueError(
                "block_cache_bytes goes with storage_options as a mapping; a SourceOptions "
                "brings its own block cache (SourceOptions(..., block_cache_bytes=...))"
            )
        return given
    if given is None and block_cache_bytes is None:
        return None
    return SourceOptions(given, block_cache_bytes=block_cache_bytes)
