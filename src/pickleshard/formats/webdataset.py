"""WebDataset: tar shards of a chosen size, read by plain ``webdataset.WebDataset(urls).decode()``.

On disk::

    OUT/shard-000000.tar ...  tar shards, each at most ``shard_bytes`` (a lone sample larger
                              than that gets a shard of its own); "urls" in the descriptor
                              is the brace pattern, e.g. "shard-{000000..000011}.tar"
    OUT/index.npy             (N,) structured: "shard" u4, and per field "offset" u8, "size" u8,
                              "kind" u1 (shape (F,)): where each member's data sits in its tar
    OUT/pickleshard.json      descriptor: fields (name, member stem), shards (name, count, bytes)
    OUT/hashes.npy            uint8 (N, 16) content digests (see pickleshard.formats.base)

Sample ``i`` is the members ``{key}.{stem}.{ext}`` with ``key = f"{i:010d}"`` and, per value
type (see :mod:`pickleshard.formats.encoding`): ``npy`` for arrays, ``scalar.npy`` for numpy
scalars (0-d, as webdataset decodes it), ``cls`` for Python ints, ``txt`` for str, ``json`` for
other JSON-exact values (float, bool, None, lists, dicts), ``pickle`` for anything else
(protocol 5): webdataset's default ``.decode()`` reads every one of them. Members carry mtime
0, mode 0444 and no owner, so the same input gives the same bytes.

Reading: :class:`WebDatasetReader` is an ``IterableDataset``: each epoch (``set_epoch``) the
shard order is shuffled from ``(seed, epoch)``, the samples laid end to end are cut into one
contiguous part per rank (padded by wrapping around unless ``drop_last``) and one per DataLoader
worker, and each worker streams its part through a shuffle buffer of ``buffer_size`` samples.
Through ``index.npy`` it also supports ``ds[i]`` and ``__getitems__``.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import sys
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

import numpy as np

from ..io.atomic import atomic_path
from ..io.handles import ProcessLocal
from ..samplers import distributed_rank_and_world
from .base import (
    ConvertedDataset,
    Format,
    PartResult,
    PartSpec,
    PartWriter,
    ReadOptions,
    Sample,
    WriteOptions,
    field_stems,
)
from .encoding import encode_member
from .files import NpyWriter, iter_raw_chunks
from .npy import map_npy
from .registry import register_format

_T = TypeVar("_T")

try:  # a real torch IterableDataset when torch is there; a plain generic class if not
    from torch.utils.data import IterableDataset as _IterableBase
except ImportError:  # pragma: no cover - exercised only without torch

    class _IterableBase(Generic[_T]):  # type: ignore[no-redef]
        """Stands in for ``torch.utils.data.IterableDataset``."""


__all__ = ["WebDatasetFormat", "WebDatasetReader", "index_dtype"]

KEY_DIGITS = 10
_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_READ_BLOCK = 4 << 20
_ROWS = 4096


def index_dtype(num_fields: int) -> np.dtype[Any]:
    return np.dtype(
        [
            ("shard", "<u4"),
            ("offset", "<u8", (num_fields,)),
            ("size", "<u8", (num_fields,)),
            ("kind", "u1", (num_fields,)),
        ]
    )


def _padded(n: int) -> int:
    return -(-n // _BLOCK) * _BLOCK


def _tar_size(offset: int) -> int:
    """Size of a tar closed at ``offset``: two zero blocks, then padding to a whole record."""
    return -(-(offset + 2 * _BLOCK) // _RECORD) * _RECORD


class WebDatasetPartWriter(PartWriter):
    """Writes ``shard-<k>.tar`` files and ``index.bin`` (raw rows of :func:`index_dtype`)."""

    def __init__(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> None:
        super().__init__(part_dir, spec, options)
        self.stems = field_stems(options.fields)
        self.shards: list[dict[str, int]] = []
        self._fh: IO[bytes] | None = None
        self._tar: tarfile.TarFile | None = None
        self._dtype = index_dtype(len(self.stems))
        self._pending: list[tuple[int, list[int], list[int], list[int]]] = []
        self._index = open(part_dir / "index.bin", "wb")  # noqa: SIM115 - closed in close()

    def _close_shard(self) -> None:
        if self._tar is not None and self._fh is not None:
            self._tar.close()
            self.shards[-1]["bytes"] = self._fh.tell()
            self._fh.close()
            self._tar = self._fh = None

    def write(self, index: int, sample: Sample) -> None:
        members = [encode_member(v) for v in sample]
        size = sum(_BLOCK + _padded(len(data)) for _, data in members)
        if self._tar is not None and _tar_size(self._tar.offset + size) > self.options.shard_bytes:
            self._close_shard()
        if self._tar is None:
            self._fh = open(self.part_dir / f"shard-{len(self.shards):05d}.tar", "wb")  # noqa: SIM115
            self._tar = tarfile.open(fileobj=self._fh, mode="w", format=tarfile.GNU_FORMAT)  # noqa: SIM115
            self.shards.append({"count": 0, "bytes": 0})
        key = f"{index:0{KEY_DIGITS}d}"
        offsets, sizes = [], []
        for (kind, data), stem in zip(members, self.stems, strict=True):
            info = tarfile.TarInfo(f"{key}.{stem}.{kind.ext}")
            info.size, info.mtime, info.mode = len(data), 0, 0o444
            self._tar.addfile(info, io.BytesIO(data))
            offsets.append(self._tar.offset - _padded(len(data)))
            sizes.append(len(data))
        self._tar.members.clear()  # type: ignore[attr-defined]  # tarfile keeps every TarInfo it wrote; nothing here reads them
        self._pending.append((len(self.shards) - 1, offsets, sizes, [int(k) for k, _ in members]))
        self.shards[-1]["count"] += 1
        if len(self._pending) >= _ROWS:
            self._flush()

    def _flush(self) -> None:
        rows = np.zeros(len(self._pending), dtype=self._dtype)
        if self._pending:
            shard, offsets, sizes, kinds = zip(*self._pending, strict=True)
            rows["shard"], rows["offset"], rows["size"], rows["kind"] = shard, offsets, sizes, kinds
        self._index.write(rows.tobytes())
        self._pending.clear()

    def close(self) -> dict[str, Any]:
        self._close_shard()
        self._flush()
        self._index.close()
        return {"shards": self.shards}


class WebDatasetFormat(Format):
    """The WebDataset format (module docstring)."""

    name = "webdataset"
    uses_shard_bytes = True

    def part_writer(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> PartWriter:
        return WebDatasetPartWriter(part_dir, spec, options)

    def finalize(
        self, staging: Path, parts: Sequence[PartResult], options: WriteOptions
    ) -> dict[str, Any]:
        dtype = index_dtype(len(options.fields))
        index = NpyWriter(staging / "index.npy", dtype, (options.num_samples,))
        shards: list[dict[str, Any]] = []
        for part in parts:
            base = len(shards)
            for k, shard in enumerate(part.summary["shards"]):
                name = f"shard-{len(shards):06d}.tar"
                _link_or_copy(part.dir / f"shard-{k:05d}.tar", staging / name)
                shards.append({"name": name, **shard})
            for rows in iter_raw_chunks(part.dir / "index.bin", dtype):
                rows["shard"] += base
                index.write(rows)
        index.close()
        stems = field_stems(options.fields)
        last = f"{len(shards) - 1:06d}"
        return {
            "fields": [
                {"name": f, "member": s} for f, s in zip(options.fields, stems, strict=True)
            ],
            "shards": shards,
            "urls": f"shard-{{000000..{last}}}.tar" if shards else None,
            "index": "index.npy",
            "key_digits": KEY_DIGITS,
            "shard_bytes": options.shard_bytes,
        }

    def open(
        self, root: Path, descriptor: dict[str, Any], options: ReadOptions
    ) -> ConvertedDataset:
        return WebDatasetReader(root, descriptor, options)


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` as ``dst`` (instant, and the part stays whole), else copy it."""
    try:
        os.link(src, dst)
    except OSError:
        with atomic_path(dst) as tmp:
            shutil.copyfile(src, tmp)


def cut_runs(
    runs: Sequence[tuple[int, int]], total: int, start: int, stop: int
) -> list[tuple[int, int]]:
    """Positions ``[start, stop)`` of the runs laid end to end (wrapping modulo ``total``)."""
    out: list[tuple[int, int]] = []
    ends = np.cumsum([b - a for a, b in runs])
    pos = start
    while pos < stop and total:
        p = pos % total
        k = int(np.searchsorted(ends, p, side="right"))
        a, b = runs[k]
        first = a + p - (int(ends[k]) - (b - a))
        take = min(b - first, stop - pos)
        out.append((first, first + take))
        pos += take
    return out


def _worker() -> tuple[int, int]:
    data = sys.modules.get("torch.utils.data")
    info = None if data is None else data.get_worker_info()
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))


class WebDatasetReader(ConvertedDataset, _IterableBase[Sample]):
    """Reads a WebDataset conversion: iterable (shuffled, split) and indexable (module docstring)."""

    def __init__(
        self, root: Path, descriptor: dict[str, Any], options: ReadOptions | None = None
    ) -> None:
        self.options = options or ReadOptions()
        super().__init__(root, descriptor, self.options.policy)
        self.epoch = 0
        self.shards: list[dict[str, Any]] = descriptor["shards"]
        counts = np.array([s["count"] for s in self.shards], dtype=np.int64)
        self.shard_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        try:
            self.index = map_npy(root / descriptor["index"])
        except (OSError, ValueError) as exc:
            raise self._corrupt(f"cannot open index.npy: {exc}") from None
        if len(self.index) != len(self) or int(self.shard_starts[-1]) != len(self):
            raise self._corrupt("index.npy and the shard list do not match the sample count")
        # this process's descriptors of the shards it read, by shard
        self._fds: ProcessLocal[dict[int, int]] = ProcessLocal(dict, _close_fds)

    # ---- random access ------------------------------------------------------------------------

    def _fd(self, shard: int) -> int:
        fds = self._fds.get()
        fd = fds.get(shard)
        if fd is None:
            path = self.root / self.shards[shard]["name"]
            try:
                fd = fds[shard] = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise self._corrupt(f"cannot open shard {path.name}: {exc.strerror}") from None
        return fd

    def _decode(
        self, i: int, members: Sequence[tuple[int, int, int]], block: bytes, base: int
    ) -> Sample:
        """Sample ``i`` from its members ``(offset, size, kind)``; ``block`` starts at ``base``."""
        view = memoryview(block)
        out = []
        for off, size, kind in members:
            a = off - base
            if a < 0 or a + size > len(view):
                raise self._corrupt("index points outside its shard", i)
            out.append(self._decode_value(kind, view[a : a + size], i))
        return tuple(out)

    def _members(self, rows: Any) -> list[list[tuple[int, int, int]]]:
        """Per row of the index, its members as ``(offset, size, kind)``, as Python ints."""
        cols = zip(
            rows["offset"].tolist(), rows["size"].tolist(), rows["kind"].tolist(), strict=True
        )
        return [list(zip(o, s, k, strict=True)) for o, s, k in cols]

    def _get(self, i: int) -> Sample:
        (members,) = self._members(self.index[i : i + 1])
        lo = members[0][0]
        hi = members[-1][0] + members[-1][1]
        block = os.pread(self._fd(int(self.index["shard"][i])), hi - lo, lo)
        return self._decode(i, members, block, lo)

    # ---- iteration ----------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shard order and shuffle the next iteration uses."""
        self.epoch = epoch

    @property
    def samples_per_rank(self) -> int:
        _, world = distributed_rank_and_world(self.options.rank, self.options.world_size)
        n = len(self)
        return n // world if self.options.drop_last else math.ceil(n / world)

    def runs(self, worker: int = 0, num_workers: int = 1) -> list[tuple[int, int]]:
        """The global sample ranges one worker of this rank reads this epoch, in read order."""
        opts = self.options
        rank, _ = distributed_rank_and_world(opts.rank, opts.world_size)
        rng = np.random.default_rng([opts.seed, self.epoch])
        order = rng.permutation(len(self.shards)) if opts.shuffle else range(len(self.shards))
        shard_runs = [
            (int(self.shard_starts[s]), int(self.shard_starts[s + 1]))
            for s in order
            if self.shards[s]["count"]
        ]
        m = self.samples_per_rank
        mine = cut_runs(shard_runs, len(self), rank * m, (rank + 1) * m)
        return cut_runs(mine, m, m * worker // num_workers, m * (worker + 1) // num_workers)

    def _stream(self, runs: Sequence[tuple[int, int]]) -> Iterator[Sample]:
        """Samples of ``runs`` (each inside one shard), read in blocks of about 4 MiB."""
        for a, b in runs:
            rows = self.index[a:b]
            starts = rows["offset"][:, 0].astype(np.int64)
            ends = (rows["offset"][:, -1] + rows["size"][:, -1]).astype(np.int64)
            fd = self._fd(int(rows["shard"][0])) if b > a else -1
            i = 0
            while i < b - a:
                lo = int(starts[i])
                stop = int(np.searchsorted(ends, lo + _READ_BLOCK, side="right"))
                stop = min(b - a, max(stop, i + 1))
                block = os.pread(fd, int(ends[stop - 1]) - lo, lo)
                for k, members in enumerate(self._members(rows[i:stop]), start=i):
                    yield self._decode(a + k, members, block, lo)
                i = stop

    def __iter__(self) -> Iterator[Sample]:
        worker, num_workers = _worker()
        rank, _ = distributed_rank_and_world(self.options.rank, self.options.world_size)
        stream = map(self.sample_form.build, self._stream(self.runs(worker, num_workers)))
        if not self.options.shuffle or self.options.buffer_size <= 1:
            yield from stream
            return
        rng = np.random.default_rng([self.options.seed, self.epoch, rank, worker])
        buf: list[Sample] = []
        for sample in stream:
            if len(buf) < self.options.buffer_size:
                buf.append(sample)
                continue
            j = int(rng.integers(len(buf)))
            yield buf[j]
            buf[j] = sample
        rng.shuffle(buf)
        yield from buf

    def __reduce__(self) -> tuple[Any, ...]:
        # Reopened by path in spawned workers: index.npy is mapped again, never copied.
        return (_reopen, (self.root, self.descriptor, self.options, self.epoch))


def _close_fds(fds: dict[int, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):  # one that fails leaves the others to close
            os.close(fd)


def _reopen(
    root: Path, descriptor: dict[str, Any], options: ReadOptions, epoch: int
) -> WebDatasetReader:
    reader = WebDatasetReader(root, descriptor, options)
    reader.epoch = epoch
    return reader


register_format(WebDatasetFormat)
