"""``MixedDataset``: several map-style datasets as one, in weighted proportions per epoch.

The sources are duck-typed (``__len__``, ``__getitem__``, optionally ``__getitems__`` and
``fields``), so a :class:`pickleshard.PickleDataset`, a converted dataset from
:func:`pickleshard.open_dataset` or any map-style dataset mix alike, and this package imports
neither ``dataset`` nor ``formats``. Which sample sits at each position of an epoch is
:class:`~pickleshard.mixing.plan.MixPlan`'s arithmetic.

An index is one of two kinds. ``i`` in ``[0, epoch_size)`` is position ``i`` of the epoch set by
:meth:`MixedDataset.set_epoch`. ``epoch_size + j`` is *resolved*: sample ``j`` of the sources laid
end to end, whatever the epoch set (:meth:`MixedDataset.resolve` makes them).
:class:`~pickleshard.mixing.sampler.MixSampler` yields resolved indices, computed in chunks for
the epoch its pass is in: DataLoader workers (persistent or not) and a resumed pass read that
epoch's mix, never a stale copy's, and a batch costs them no Feistel evaluation.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

try:  # a real torch Dataset when torch is there (isinstance checks, typing); plain class if not
    from torch.utils.data import Dataset as _DatasetBase
except ImportError:  # pragma: no cover - exercised only without torch
    # generic, as torch's is: the class statement below subscripts it
    _T = TypeVar("_T")

    class _DatasetBase(Generic[_T]):  # type: ignore[no-redef]
        """Stands in for ``torch.utils.data.Dataset``."""


from ..read.batch import JoinedBatch, SampleBatch
from ..read.collate import batch_allocator
from .errors import MixedFieldsError
from .plan import MixPlan, Policy, apportion

__all__ = ["MixedDataset", "Source"]

Transform = Callable[[Any], Any]
_FEW_SOURCES = 8  # up to this many, a batch is split by a mask per source, else by one sort


class Source(Protocol):
    """What a mix needs of a source: a map-style dataset."""

    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> Any: ...


def _counts(
    sizes: Sequence[int], weights: Sequence[float] | None, epoch_size: int | None
) -> list[int]:
    if weights is None:  # in proportion to the sources' sizes
        weights = list(sizes)
    if len(weights) != len(sizes):
        raise ValueError(f"{len(sizes)} datasets but {len(weights)} weights")
    integral = all(isinstance(w, int | np.integer) and not isinstance(w, bool) for w in weights)
    if epoch_size is None and integral:  # absolute counts
        return apportion(weights, sum(int(w) for w in weights))
    total = sum(sizes) if epoch_size is None else epoch_size
    if total < 1:
        raise ValueError(f"need epoch_size >= 1, got {total}")
    return apportion(weights, total)


def _fields(source: Any) -> tuple[str, ...] | None:
    fields = getattr(source, "fields", None)
    return None if fields is None else tuple(fields)


class MixedDataset(_DatasetBase[Any]):
    """``datasets`` mixed into epochs of ``epoch_size`` samples, in ``weights``' proportions.

    ``weights``: one per dataset. Integers without ``epoch_size`` are absolute counts per
    epoch (``epoch_size`` is their sum); otherwise they are proportions, ``epoch_size`` apportioned by the
    largest remainder method, so each epoch draws exactly :attr:`counts` samples from each
    source. Default: in proportion to the datasets' sizes, ``epoch_size`` their total (one pass
    over each per epoch, like concatenating and shuffling them).

    Within a source, samples are drawn without replacement across epochs (a Feistel permutation
    per pass over it), so its order continues from one epoch to the next; once it is exhausted,
    ``policy`` says what follows: ``"repeat"`` (default) another pass in a fresh order,
    ``"resample"`` draws with replacement, ``"stop"`` raises
    :class:`~pickleshard.mixing.errors.SourceExhaustedError` for an epoch that would need one.
    The epoch's positions are shuffled by a Feistel permutation keyed by ``(seed, epoch)``: no
    list of indices is held, whatever the size.

    ``transforms``: one callable (or None) per dataset, applied to its samples. Sources whose
    ``fields`` differ raise :class:`~pickleshard.mixing.errors.MixedFieldsError` naming them,
    unless every source but those of one schema has a transform. ``tag=True`` appends the
    sample's source index to each sample tuple (``(x, y, source)``).

    ``ds[i]``/``__getitems__`` read position ``i`` of the epoch set by :meth:`set_epoch`
    (default 0), or for ``i >= epoch_size`` the resolved index's sample (what
    :class:`~pickleshard.mixing.sampler.MixSampler` yields; see the module docstring). ``__getitems__`` groups a batch by
    source and reads each with one ``__getitems__`` call. :meth:`locate` says which source and
    sample each position holds.
    """

    def __init__(
        self,
        datasets: Sequence[Source],
        weights: Sequence[float] | None = None,
        *,
        epoch_size: int | None = None,
        policy: Policy = "repeat",
        seed: int = 0,
        tag: bool = False,
        transforms: Sequence[Transform | None] | None = None,
    ) -> None:
        if not datasets:
            raise ValueError("a mix needs at least one dataset")
        self.datasets = list(datasets)
        sizes = [len(d) for d in self.datasets]
        self.transforms = [None] * len(sizes) if transforms is None else list(transforms)
        if len(self.transforms) != len(sizes):
            raise ValueError(f"{len(sizes)} datasets but {len(self.transforms)} transforms")
        self.plan = MixPlan(sizes, _counts(sizes, weights, epoch_size), policy, seed)
        self._firsts = np.cumsum([0, *sizes[:-1]], dtype=np.int64)  # the sources end to end
        self._total = sum(sizes)
        self.tag = tag
        self.fields = self._check_fields()
        self.epoch = 0
        self.plan.check_epoch(0)

    def _check_fields(self) -> tuple[str, ...] | None:
        """The mix's fields (None when unknown); raise if untransformed sources disagree."""
        raw = [_fields(d) for d in self.datasets]
        plain = {f for f, t in zip(raw, self.transforms, strict=True) if t is None and f}
        if len(plain) > 1:
            raise MixedFieldsError(
                [f if t is None else None for f, t in zip(raw, self.transforms, strict=True)]
            )
        found = next(iter(plain)) if plain else None  # a transform maps to the plain schema
        return None if found is None else found + (("source",) if self.tag else ())

    @property
    def counts(self) -> list[int]:
        """Samples drawn from each source per epoch."""
        return list(self.plan.counts)

    @property
    def epoch_size(self) -> int:
        return self.plan.epoch_size

    @property
    def policy(self) -> Policy:
        return self.plan.policy

    @property
    def seed(self) -> int:
        return self.plan.seed

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s mix for indices below ``epoch_size``."""
        self.plan.check_epoch(epoch)
        self.epoch = epoch

    def __len__(self) -> int:
        return self.plan.epoch_size

    def resolve(self, epoch: int, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The resolved indices (see the class docstring) of ``positions`` of ``epoch``: each
        names its source and sample whatever the epoch set later. Raises as :meth:`set_epoch`
        for an epoch the ``"stop"`` policy cannot fill."""
        self.plan.check_epoch(epoch)
        sources, samples = self.plan.locate(epoch, positions)
        resolved: np.ndarray = self.plan.epoch_size + self._firsts[sources] + samples
        return resolved

    def locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(sources, samples)`` as int64 arrays: the source and its sample index that each of
        ``indices`` reads (indices as in ``ds[i]``)."""
        given = np.asarray(indices, dtype=np.int64).reshape(-1)
        n, top = self.plan.epoch_size, self.plan.epoch_size + self._total
        if len(given) and int(given.min()) >= n and int(given.max()) < top:
            # All resolved, what MixSampler yields: no shuffle to compute, one lookup per batch.
            flat = given - n
            found = np.searchsorted(self._firsts, flat, side="right") - 1
            return found, flat - self._firsts[found]
        wanted = np.where(given < 0, given + n, given)  # -1: the epoch's last position
        if len(wanted) and (int(wanted.min()) < 0 or int(wanted.max()) >= top):
            bad = given[(wanted < 0) | (wanted >= top)]
            raise IndexError(
                f"sample index {int(bad[0])} out of range for a mix of {n} positions and "
                f"{self._total} resolved indices ({-n} <= i < {top})"
            )
        resolved = wanted >= n
        sources, samples = self.plan.locate(self.epoch, np.where(resolved, 0, wanted))
        if resolved.any():
            flat = wanted[resolved] - n
            sources[resolved] = np.searchsorted(self._firsts, flat, side="right") - 1
            samples[resolved] = flat - self._firsts[sources[resolved]]
        return sources, samples

    def _finish(self, source: int, sample: Any) -> Any:
        transform = self.transforms[source]
        if transform is not None:
            sample = transform(sample)
        if self.tag:
            sample = (*sample, source) if isinstance(sample, tuple) else (sample, source)
        return sample

    def __getitem__(self, i: int) -> Any:
        sources, samples = self.locate([i])
        s = int(sources[0])
        return self._finish(s, self.datasets[s][int(samples[0])])

    def _by_source(self, sources: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """``(source, where)`` for each source in ``sources``, ``where`` its places in order."""
        count = len(self.datasets)
        if count <= _FEW_SOURCES:  # a mask per source: cheaper than a sort for a few
            for s in range(count):
                where = np.flatnonzero(sources == s)
                if len(where):
                    yield s, where
            return
        order = np.argsort(sources, kind="stable")  # by source, request order within one
        bounds = np.searchsorted(sources[order], np.arange(count + 1)).tolist()
        for s, (a, b) in enumerate(itertools.pairwise(bounds)):
            if a < b:
                yield s, order[a:b]

    def __getitems__(self, indices: Sequence[int]) -> Sequence[Any]:
        """A batch in request order, each source read with one ``__getitems__`` call (or its
        ``ds[i]`` one by one when it has none). Sources read by field (``SampleBatch``) of one
        form, untagged and untransformed, make one :class:`~pickleshard.read.batch.JoinedBatch`
        (``pickleshard.collate`` reads its columns); anything else a list."""
        sources, samples = self.locate(indices)
        got_by: list[tuple[int, np.ndarray, Any]] = []
        for s, where in self._by_source(sources):
            wanted = samples[where].tolist()
            source = self.datasets[s]
            many = getattr(source, "__getitems__", None)
            got_by.append(
                (s, where, many(wanted) if many is not None else [source[i] for i in wanted])
            )
        parts = [got for _, _, got in got_by]
        plain = not self.tag and all(t is None for t in self.transforms)
        if (
            plain
            and parts
            and all(isinstance(p, SampleBatch) and p.build == parts[0].build for p in parts)
        ):
            src = np.zeros(len(sources), np.intp)
            pos = np.zeros(len(sources), np.intp)
            for k, (_, where, _) in enumerate(got_by):
                src[where], pos[where] = k, np.arange(len(where))
            return JoinedBatch(parts, src, pos, batch_allocator())
        out: list[Any] = [None] * len(sources)
        for s, where, got in got_by:
            finish = self.tag or self.transforms[s] is not None
            for k, sample in zip(where.tolist(), got, strict=True):
                out[k] = self._finish(s, sample) if finish else sample
        return out

    def __repr__(self) -> str:
        return (
            f"MixedDataset(sources={len(self.datasets)}, counts={self.counts}, "
            f"epoch_size={self.epoch_size}, policy={self.policy!r}, seed={self.seed}, "
            f"epoch={self.epoch}, tag={self.tag})"
        )
