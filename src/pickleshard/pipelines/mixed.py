"""Several weighted sources as one input to ``convert`` and ``verify``: a mix's epoch, in order.

``convert(MixedDataset(...), out)``, ``convert([a, b], out, weights=...)`` and
``pickleshard convert A B OUT --weights ...`` write what :class:`MixInput` reads: positions
``0 .. epoch_size - 1`` of one epoch of a :class:`~pickleshard.mixing.MixedDataset` (the epoch
it is set to, 0 for a new one), in that order, so the output's sample ``i`` is ``mix[i]``. The
output's descriptor records the mix (:func:`recorded_mix`: each source's identity, the counts
per epoch, policy, seed, epoch, tag), which is all ``verify`` needs to rebuild it from the same
sources (:func:`verify_input`).

Sources given by path open as :class:`~pickleshard.PickleDataset`, or with
:func:`~pickleshard.formats.open_dataset` when the folder holds a conversion; datasets are used
as they are (any map-style dataset mixes; one without files or a root is recorded by its type
and length only, which resume cannot tell apart from another of the same shape).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..dataset import PickleDataset
from ..errors import ConvertedDatasetError, VerifyMismatchError
from ..formats import PartSpec, open_dataset
from ..formats.base import DESCRIPTOR_NAME, ConvertedDataset, read_descriptor
from ..io.remote.listing import without_credentials
from ..mixing import MixedDataset, Policy
from ..producers.plain import ConvertTransform
from .inputs import source_dataset

__all__ = [
    "MIX_KEY",
    "MixInput",
    "dataset_identity",
    "mix_input",
    "plan_positions",
    "recorded_mix",
    "verify_input",
]

MIX_KEY = "mix"  # the key of a mix in a conversion's identity["source"]
MIN_PART_SAMPLES = 64  # a mix's part: at least this many positions (fewer parts for a small mix)
_MIX_DEFAULTS: dict[str, Any] = {"epoch_size": None, "policy": "repeat", "seed": 0, "tag": False}


def dataset_identity(ds: PickleDataset) -> dict[str, Any]:
    """What names a PickleDataset's content in a conversion's identity: root, fields, files."""
    return {
        "root": without_credentials(os.fspath(ds.source.root)),  # written to the output
        "fields": list(ds.fields),
        "sample_form": ds.index.sample_form.kind,  # what open_dataset hands out
        "num_samples": len(ds),
        "files": [
            [f.path, f.size, f.mtime_ns, f.fingerprint, f.num_samples] for f in ds.index.files
        ],
    }


def _member_identity(member: Any) -> dict[str, Any]:
    if isinstance(member, PickleDataset):
        return {**dataset_identity(member), "encoding": member.policy.encoding}
    if isinstance(member, ConvertedDataset):  # its own descriptor names its content
        return {
            "converted": os.fspath(Path(member.root).absolute()),
            "to": member.descriptor.get("to"),
            "num_samples": len(member),
            "identity": member.descriptor.get("identity"),
        }
    return {
        "dataset": f"{type(member).__module__}.{type(member).__qualname__}",
        "num_samples": len(member),
    }


def plan_positions(n: int, max_parts: int) -> list[PartSpec]:
    """``[0, n)`` cut into about ``max_parts`` equal runs of positions (no files: ``0, 0``)."""
    size = max(MIN_PART_SAMPLES, -(-n // max(1, max_parts)))
    return [PartSpec(k, a, min(a + size, n), 0, 0) for k, a in enumerate(range(0, n, size))]


class MixInput:
    """What convert's parts and verify's runs read of a mix: positions ``[0, epoch_size)`` of
    ``epoch``, in order, each sample passed through ``transform`` (convert's ``transform=``)
    and :func:`~pickleshard.producers.plain.plain_sample`. Picklable when the mix is."""

    def __init__(
        self,
        mix: MixedDataset,
        epoch: int | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self.mix = mix
        self.epoch = mix.epoch if epoch is None else epoch
        mix.plan.check_epoch(self.epoch)  # SourceExhaustedError now, not in a part
        self.transform = ConvertTransform(None, transform)
        self.fields = self._fields()

    def _fields(self) -> tuple[str, ...]:
        if self.mix.fields is not None:
            return self.mix.fields
        for member in self.mix.datasets:  # every source transformed: to the schema of the first
            found = getattr(member, "fields", None)
            if found is not None:
                return (*found, *(("source",) if self.mix.tag else ()))
        raise ValueError(
            "a mix converts only when its fields are known, and none of its sources has "
            "`fields`: mix datasets that name their fields (PickleDataset, open_dataset)"
        )

    def __len__(self) -> int:
        return self.mix.epoch_size

    def __getitems__(self, positions: Sequence[int]) -> list[Any]:
        resolved = self.mix.resolve(self.epoch, np.asarray(positions, dtype=np.int64))
        return [self.transform(s) for s in self.mix.__getitems__(resolved.tolist())]

    def origin(self, position: int) -> tuple[str, int, str]:
        """``(file, sample, what)`` for an error about ``position``: the source's file (or its
        root, or a name) and the sample's index there, and which source of the mix it is."""
        resolved = self.mix.resolve(self.epoch, [position])
        sources, samples = self.mix.locate(resolved)
        s, j = int(sources[0]), int(samples[0])
        member = self.mix.datasets[s]
        what = f"mix position {position} is source {s}'s sample {j}"
        if isinstance(member, PickleDataset):
            pos, _ = member.index.locate(j)
            return os.fspath(member.source.absolute(member.index.files[pos].path)), j, what
        root = getattr(member, "root", None)
        return (f"<mix source {s}>" if root is None else os.fspath(root)), j, what

    def identity(self) -> dict[str, Any]:
        """The mix, as a conversion's ``identity["source"]`` records it."""
        mix = self.mix
        return {
            MIX_KEY: {
                "sources": [_member_identity(d) for d in mix.datasets],
                "counts": mix.counts,
                "policy": mix.policy,
                "seed": mix.seed,
                "epoch": self.epoch,
                "tag": mix.tag,
                "transforms": [t is not None for t in mix.transforms],
            },
            "fields": list(self.fields),
            "num_samples": len(self),
        }

    def sample_bytes(self) -> int:
        """The largest decoded size of a sample among the sources, by their indexes' estimates
        (a source without an index: its first sample's pickled size)."""
        sizes = [1]
        for member in self.mix.datasets:
            if isinstance(member, PickleDataset):
                files = member.index.files
                sizes += [f.decoded_nbytes // max(1, f.num_samples) for f in files]
            elif len(member):
                sizes.append(len(pickle.dumps(member[0], protocol=5)))
        return max(sizes)


def _open_member(source: Any, opening: Mapping[str, Any]) -> Any:
    """A mix's source as a dataset: a dataset as is; a folder holding a conversion through
    open_dataset; any other path (directory, glob, file, URL) or list of files as a
    PickleDataset."""
    files = isinstance(source, list | tuple) and all(
        isinstance(p, str | os.PathLike) for p in source
    )
    path = isinstance(source, str | os.PathLike)
    if path and (Path(source) / DESCRIPTOR_NAME).is_file():
        return open_dataset(source, shuffle=False)
    if path or files:
        return PickleDataset(source, rebuild="auto", **opening)
    return source  # a dataset


def mix_input(
    source: Any,
    *,
    weights: Sequence[float] | None,
    epoch_size: int | None,
    policy: Policy,
    seed: int,
    tag: bool,
    transform: Callable[[Any], Any] | None,
    opening: Mapping[str, Any],
) -> MixInput | None:
    """What convert reads when ``source`` is a mix: a MixedDataset, or (with ``weights``) one
    source or a list of sources, each opened with ``opening`` (PickleDataset's keywords).
    None for a single-source conversion; ``ValueError`` for mix options without a mix."""
    options = {"epoch_size": epoch_size, "policy": policy, "seed": seed, "tag": tag}
    given = [k for k, v in options.items() if v != _MIX_DEFAULTS[k]]
    if isinstance(source, MixedDataset):
        if weights is not None or given:
            raise ValueError(
                "source is a MixedDataset: its own weights, epoch_size, policy, seed and tag "
                f"apply; do not pass {', '.join(['weights'] * (weights is not None) + given)}"
            )
        return MixInput(source, transform=transform)
    if weights is None:
        if given:
            raise ValueError(
                f"{', '.join(given)} apply to a mix: pass weights= (one per source) with a list "
                "of sources, or a MixedDataset"
            )
        return None
    listed = list(source) if isinstance(source, list | tuple) else [source]
    members = [_open_member(s, opening) for s in listed]
    mix = MixedDataset(members, weights, epoch_size=epoch_size, policy=policy, seed=seed, tag=tag)
    return MixInput(mix, transform=transform)


def recorded_mix(out: str | os.PathLike[str], *, strict: bool = True) -> dict[str, Any] | None:
    """The mix a conversion in ``out`` was written from, as :meth:`MixInput.identity` recorded
    it; None when it was written from one source (or records no identity). ``out`` not a
    conversion: :class:`~pickleshard.errors.ConvertedDatasetError`, or None if not ``strict``."""
    try:
        identity = read_descriptor(out).get("identity")
    except ConvertedDatasetError:
        if strict:
            raise
        return None
    found = identity.get("source", {}).get(MIX_KEY) if isinstance(identity, dict) else None
    return found if isinstance(found, dict) else None


def _describe_recorded(recorded: Mapping[str, Any]) -> str:
    names = [
        s.get("root") or s.get("converted") or s.get("dataset") or "?" for s in recorded["sources"]
    ]
    return (
        f"a mix of {len(names)} source(s) ({', '.join(map(str, names))}) with counts "
        f"{recorded['counts']} per epoch, policy {recorded['policy']!r}, seed {recorded['seed']}, "
        f"epoch {recorded['epoch']}, tag {recorded['tag']}"
    )


def verify_input(
    source: Any, out: str | os.PathLike[str], opening: Mapping[str, Any]
) -> PickleDataset | MixInput:
    """What ``verify`` compares conversion ``out`` with: ``source`` as convert read it.

    A conversion written from a mix is compared with the mix rebuilt from what its descriptor
    records (counts, policy, seed, epoch, tag) over ``source``: its sources in order (a list,
    or one), or a MixedDataset, which must match the record. Raises
    :class:`~pickleshard.errors.VerifyMismatchError` when they cannot be the mix it was written
    from (another number of sources, other parameters, per-source transforms not given).
    """
    recorded = recorded_mix(out)
    if recorded is None:
        if isinstance(source, MixedDataset):
            raise VerifyMismatchError(
                out, "was converted from one source, not a mix: give that source, or none"
            )
        return source_dataset(source, **opening)
    what = _describe_recorded(recorded)
    if isinstance(source, MixedDataset):
        mix = source
        got = (mix.counts, mix.policy, mix.seed, mix.tag)
        want = (recorded["counts"], recorded["policy"], recorded["seed"], recorded["tag"])
        if got != want or len(mix.datasets) != len(recorded["sources"]):
            raise VerifyMismatchError(
                out, f"was converted from {what}; the mix given differs: {mix!r}"
            )
        return MixInput(mix, epoch=recorded["epoch"])
    listed = list(source) if isinstance(source, list | tuple) else [source]
    if len(listed) != len(recorded["sources"]):
        raise VerifyMismatchError(
            out,
            f"was converted from {what}; got {len(listed)} source(s): give all of them, in "
            "order, or none to check the digests stored at conversion time",
        )
    if any(recorded.get("transforms", [])):
        raise VerifyMismatchError(
            out,
            f"was converted from {what}, with per-source transforms a path cannot carry: verify "
            "against the MixedDataset itself (Python), or with no source (the stored digests)",
        )
    members = [_open_member(s, opening) for s in listed]
    for s, (member, entry) in enumerate(zip(members, recorded["sources"], strict=True)):
        if len(member) != entry.get("num_samples"):
            raise VerifyMismatchError(
                out,
                f"was converted from {what}; source {s} ({listed[s]}) has {len(member)} samples "
                f"now, {entry.get('num_samples')} then",
            )
    try:
        mix = MixedDataset(
            members,
            [int(c) for c in recorded["counts"]],  # absolute counts per epoch
            policy=recorded["policy"],
            seed=int(recorded["seed"]),
            tag=bool(recorded["tag"]),
        )
    except (KeyError, TypeError) as exc:
        raise ConvertedDatasetError(
            out, f"records a malformed mix ({exc}): convert again"
        ) from None
    return MixInput(mix, epoch=int(recorded["epoch"]))
