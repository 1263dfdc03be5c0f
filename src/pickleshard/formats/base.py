"""The one interface every output format implements: a part writer, a finalizer, a reader.

Conversion (:mod:`pickleshard.pipelines.convert.run`) cuts the source into *parts*, contiguous ranges of global
sample indices made of whole source files. For each part it asks the format for a
:class:`PartWriter`, which writes the part's samples, in order, into a private directory and
returns a JSON summary. When every part is done, :meth:`Format.finalize` turns the parts into
the final files (streaming, never holding a part in memory) and returns the format's entries of
the descriptor. :meth:`Format.open` reads the result back as a :class:`ConvertedDataset`.

Every converted dataset directory holds, besides the format's own files::

    pickleshard.json   the descriptor: {"format": "pickleshard-converted", "version": 2,
                       "to": <format>, "tool_version": ..., "num_samples": N,
                       "hashes": "hashes.npy", "fields": [{"name": ..., ...}, ...],
                       "sample_form": "tuple" | "dict" (the source's, absent: tuple),
                       <format keys>, "identity": {"source": {root, fields, num_samples,
                       files: [[path, size, mtime_ns, fingerprint, samples], ...]},
                       "options": {to, format, shard_bytes, encoding}}}
    hashes.npy         uint8 (N, 16): each sample's content digest
                       (:func:`pickleshard.formats.digest.sample_digest`), used by verify

Values are stored in the plain encodings of :mod:`pickleshard.formats.encoding` (``.npy``,
decimal text, UTF-8, JSON, pickle protocol 5); a reader loads pickled values under the
:class:`~pickleshard.safety.UnpicklePolicy` it was opened with. Version 1 outputs (values in
pickleshard's own PSS codec) are refused with the fix: convert again.
"""

from __future__ import annotations

import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from ..errors import ConvertedDatasetError
from ..safety import DEFAULT_POLICY, UnpicklePolicy
from ..scan.sampleform import FORM_KINDS, SampleForm
from .encoding import decode_member

_T = TypeVar("_T")

try:  # a real torch Dataset when torch is there; a plain generic class if not
    from torch.utils.data import Dataset as _DatasetBase
except ImportError:  # pragma: no cover - exercised only without torch

    class _DatasetBase(Generic[_T]):  # type: ignore[no-redef]
        """Stands in for ``torch.utils.data.Dataset``."""


__all__ = [
    "DESCRIPTOR_NAME",
    "HASHES_NAME",
    "ConvertedDataset",
    "Format",
    "PartResult",
    "PartSpec",
    "PartWriter",
    "ReadOptions",
    "Sample",
    "WriteOptions",
    "field_stems",
    "read_descriptor",
]

DESCRIPTOR_NAME = "pickleshard.json"
HASHES_NAME = "hashes.npy"
FORMAT_NAME = "pickleshard-converted"
FORMAT_VERSION = 2
_RESERVED_STEMS = frozenset({"hashes", "index", "pickleshard", "data", "lock", "manifest"})

Sample = tuple[Any, ...]


@dataclass(frozen=True)
class PartSpec:
    """Part ``id`` covers global samples ``[start, stop)``: source files ``[first_file, end_file)``."""

    id: int
    start: int
    stop: int
    first_file: int
    end_file: int

    @property
    def count(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class WriteOptions:
    """What a part writer needs to know beyond its part: the fields and the format's knobs."""

    fields: tuple[str, ...]
    num_samples: int
    shard_bytes: int


@dataclass(frozen=True)
class PartResult:
    """A finished part: its directory, its spec and the summary its writer returned."""

    dir: Path
    spec: PartSpec
    summary: dict[str, Any]


@dataclass(frozen=True)
class ReadOptions:
    """How a reader reads: ``policy`` governs pickled values (every reader); the rest is how an
    iterable reader (WebDataset) orders and splits samples (map-style readers ignore it)."""

    policy: UnpicklePolicy = DEFAULT_POLICY
    shuffle: bool = True
    seed: int = 0
    buffer_size: int = 1000
    rank: int | None = None
    world_size: int | None = None
    drop_last: bool = False


def field_stems(fields: Sequence[str]) -> tuple[str, ...]:
    """File-name-safe, unique stems for field names: ``[A-Za-z0-9_-]``, at most 48 characters.

    Names already safe are kept (``x`` -> ``x``); others are cleaned (``"a.b"`` -> ``a_b``);
    names reserved for the format's own files get a trailing ``_``; duplicates get ``_<k>``.
    """
    out: list[str] = []
    for k, name in enumerate(fields):
        stem = re.sub(r"[^A-Za-z0-9_-]", "_", str(name))[:48] or f"f{k}"
        if stem in _RESERVED_STEMS:
            stem += "_"
        base, n = stem, 1
        while stem in out:
            stem, n = f"{base}_{n}", n + 1
        out.append(stem)
    return tuple(out)


class PartWriter(ABC):
    """Writes one part's samples, in order, into ``part_dir`` (a directory it owns alone)."""

    def __init__(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> None:
        self.part_dir = part_dir
        self.spec = spec
        self.options = options

    @abstractmethod
    def write(self, index: int, sample: Sample) -> None:
        """Append global sample ``index``; raises ``TypeError`` for a value it cannot encode."""

    @abstractmethod
    def close(self) -> dict[str, Any]:
        """Flush and close every file; return a JSON-able summary for :meth:`Format.finalize`."""


class Format(ABC):
    """One output format. Implementations are stateless apart from constructor options.

    ``name`` is what the descriptor records and what :func:`pickleshard.formats.open_dataset`
    looks the format up by: register the class with
    :func:`pickleshard.formats.register_format`. ``uses_shard_bytes`` says whether the
    conversion's ``shard_bytes`` shapes the output (it is then part of the conversion's identity).
    """

    name: ClassVar[str]
    uses_shard_bytes: ClassVar[bool] = False

    @abstractmethod
    def part_writer(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> PartWriter:
        """A writer for one part."""

    @abstractmethod
    def finalize(
        self, staging: Path, parts: Sequence[PartResult], options: WriteOptions
    ) -> dict[str, Any]:
        """Build the final files in ``staging`` from ``parts``; return descriptor entries.

        After a kill it runs again from the start over the same parts, in a staging directory
        emptied of everything but the parts: so it must not change or remove anything in a
        part. The returned dict must include ``"fields"``: one dict per field with ``"name"``.
        """

    @abstractmethod
    def open(
        self, root: Path, descriptor: dict[str, Any], options: ReadOptions
    ) -> ConvertedDataset:
        """Open the finished dataset at ``root`` for reading; pickled values load under
        ``options.policy``."""

    def options_key(self) -> dict[str, Any]:
        """Constructor options that change the output (they are recorded in the manifest)."""
        return {}


def read_descriptor(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check ``root/pickleshard.json``; raise :class:`ConvertedDatasetError`."""
    where = Path(root)
    path = where / DESCRIPTOR_NAME
    try:
        desc = json.loads(path.read_text())
    except FileNotFoundError:
        what = "no such directory" if not where.exists() else f"no {DESCRIPTOR_NAME}"
        raise ConvertedDatasetError(
            where, f"{what}; expected the output of `pickleshard convert`"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConvertedDatasetError(path, f"cannot read the descriptor: {exc}") from None
    if not isinstance(desc, dict) or desc.get("format") != FORMAT_NAME:
        raise ConvertedDatasetError(path, f"not a pickleshard descriptor (format {FORMAT_NAME!r})")
    if desc.get("version") != FORMAT_VERSION:
        raise ConvertedDatasetError(
            path,
            f"convert the source again (pickleshard convert SRC {os.fspath(where)} --to "
            f"{desc.get('to')}): this output is version {desc.get('version')!r}, and this "
            f"pickleshard reads version {FORMAT_VERSION} (values in plain .npy, text, JSON and "
            "pickle instead of the PSS codec of version 1)",
        )
    for key in ("to", "num_samples", "fields"):
        if key not in desc:
            raise ConvertedDatasetError(path, f"descriptor has no {key!r} entry")
    if desc.get("sample_form", "tuple") not in FORM_KINDS:
        raise ConvertedDatasetError(
            path, f"sample_form is {desc['sample_form']!r}, expected one of {FORM_KINDS}"
        )
    return desc


class ConvertedDataset(_DatasetBase[Any]):
    """A converted dataset: ``len(ds)``, ``ds[i]`` and ``ds.__getitems__(indices)`` (a list),
    as :class:`pickleshard.PickleDataset`: each sample in the source's type
    (:attr:`sample_form`: a dict keyed by field where the producer wrote dicts, else a tuple,
    one value per field); a format's ``_get``/``_get_many`` produce the value tuples.

    Values come back with the types they had in the source: arrays with their dtype and shape
    (writable copies), Python ints as ``int``, numpy scalars as numpy scalars, objects as the
    objects (pickled ones loaded under ``policy``). Picklable (reopened by path), so spawned
    DataLoader workers can use it.
    """

    def __init__(
        self, root: Path, descriptor: dict[str, Any], policy: UnpicklePolicy = DEFAULT_POLICY
    ) -> None:
        self.root = root
        self.descriptor = descriptor
        self.policy = policy
        self.fields: tuple[str, ...] = tuple(f["name"] for f in descriptor["fields"])
        self._num_samples = int(descriptor["num_samples"])
        self.sample_form = SampleForm(descriptor.get("sample_form", "tuple"), self.fields)

    def __len__(self) -> int:
        return self._num_samples

    def _check(self, i: int) -> int:
        n = self._num_samples
        j = int(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"sample index {i} out of range for a dataset of {n} samples")
        return j

    def _check_many(self, indices: Sequence[int]) -> np.ndarray[Any, Any]:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self._num_samples
        idx = np.where(idx < 0, idx + n, idx)
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise IndexError(
                f"sample index {list(indices)[first]} out of range for a dataset of {n} samples"
            )
        return idx

    def _get(self, i: int) -> Sample:
        """Sample ``i``, already checked to be in range."""
        raise NotImplementedError

    def _get_many(self, idx: np.ndarray[Any, Any]) -> list[Sample]:
        return [self._get(int(i)) for i in idx]

    def __getitem__(self, i: int) -> Any:
        return self.sample_form.build(self._get(self._check(i)))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return self.sample_form.build_many(self._get_many(self._check_many(indices)))

    def _decode_value(self, kind: int, data: bytes | bytearray | memoryview, i: int) -> Any:
        """Value of member ``kind`` of sample ``i``: pickled ones under this reader's policy."""
        try:
            return decode_member(kind, data, self.policy, os.fspath(self.root), i)
        except ValueError as exc:
            raise self._corrupt(f"cannot decode value: {exc}", i) from None

    def _corrupt(self, message: str, sample: int | None = None) -> ConvertedDatasetError:
        return ConvertedDatasetError(self.root, message, sample=sample)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({os.fspath(self.root)!r}, samples={len(self)}, "
            f"fields={self.fields})"
        )
