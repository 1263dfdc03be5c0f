"""The format registry, and a third-party format written here, registered with one call, that
converts, opens and passes the shared :class:`~pickleshard.testing.FormatTests` kit."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard.errors import AlreadyRegisteredError, ConvertedDatasetError
from pickleshard.formats import (
    FORMAT_NAMES,
    ConvertedDataset,
    Format,
    PartResult,
    PartSpec,
    PartWriter,
    ReadOptions,
    WriteOptions,
    available_formats,
    format_class,
    get_format,
    open_dataset,
    register_format,
    registry,
)
from pickleshard.formats.base import Sample, field_stems
from pickleshard.formats.encoding import MemberKind, decode_member, encode_member
from pickleshard.formats.files import NpyWriter
from pickleshard.formats.memmap import MemmapFormat
from pickleshard.pipelines.convert.run import convert
from pickleshard.safety import UnpicklePolicy
from pickleshard.testing import FormatTests, assert_same, oracle_samples, write_files

# ---- a third-party format: one file per sample and field -----------------------------------

_SAMPLE_FILE = re.compile(r"\d{12}\.[A-Za-z0-9_-]+\.[a-z.]+")


class FileTreePartWriter(PartWriter):
    """Writes ``<sample:012d>.<field>.<ext>`` per value (the safe member encodings) and the
    members' kinds, one byte per value, to ``kinds.bin``."""

    def __init__(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> None:
        super().__init__(part_dir, spec, options)
        self.stems = field_stems(options.fields)
        self.kinds = open(part_dir / "kinds.bin", "wb")  # noqa: SIM115 - closed in close()

    def write(self, index: int, sample: Sample) -> None:
        encoded = [encode_member(value) for value in sample]  # TypeError before any file
        for stem, (kind, data) in zip(self.stems, encoded, strict=True):
            (self.part_dir / f"{index:012d}.{stem}.{kind.ext}").write_bytes(data)
        self.kinds.write(bytes(kind for kind, _ in encoded))

    def close(self) -> dict[str, Any]:
        self.kinds.close()
        return {"samples": self.spec.count}


class FileTreeFormat(Format):
    """``samples/<i:012d>.<field>.<ext>``: each value in its own file, ``.npy`` for arrays;
    ``kinds.npy`` (uint8, samples x fields) says how each file decodes."""

    name = "filetree"

    def part_writer(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> PartWriter:
        return FileTreePartWriter(part_dir, spec, options)

    def finalize(
        self, staging: Path, parts: Sequence[PartResult], options: WriteOptions
    ) -> dict[str, Any]:
        samples = staging / "samples"
        samples.mkdir()
        shape = (options.num_samples, len(options.fields))
        kinds = NpyWriter(staging / "kinds.npy", np.dtype(np.uint8), shape)
        for part in parts:
            for path in sorted(part.dir.iterdir()):
                if _SAMPLE_FILE.fullmatch(path.name):
                    os.link(path, samples / path.name)  # the part keeps its own link
            kinds.copy_from(part.dir / "kinds.bin")
        kinds.close()
        stems = field_stems(options.fields)
        return {
            "fields": [{"name": f, "stem": s} for f, s in zip(options.fields, stems, strict=True)]
        }

    def open(
        self, root: Path, descriptor: dict[str, Any], options: ReadOptions
    ) -> ConvertedDataset:
        return FileTreeDataset(root, descriptor, options.policy)


class FileTreeDataset(ConvertedDataset):
    def __init__(self, root: Path, descriptor: dict[str, Any], policy: UnpicklePolicy) -> None:
        super().__init__(root, descriptor, policy)
        self.stems = [f["stem"] for f in descriptor["fields"]]
        self.kinds = np.load(root / "kinds.npy", allow_pickle=False)

    def _get(self, i: int) -> Sample:
        values = []
        for stem, kind in zip(self.stems, self.kinds[i].tolist(), strict=True):
            path = self.root / "samples" / f"{i:012d}.{stem}.{MemberKind(kind).ext}"
            try:
                values.append(decode_member(kind, path.read_bytes(), self.policy, str(path), i))
            except (OSError, ValueError) as exc:
                raise self._corrupt(f"{path.name}: {exc}", sample=i) from None
        return tuple(values)


register_format(FileTreeFormat)


class TestFileTreeFormat(FormatTests):
    format = "filetree"


# ---- the registry --------------------------------------------------------------------------


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test are undone after it."""
    monkeypatch.setattr(registry, "_classes", dict(registry._classes))
    monkeypatch.setattr(registry, "_known", dict(registry._known))


def test_the_third_party_format_is_found_by_name_and_opened_from_its_descriptor(
    tmp_path: Path,
) -> None:
    paths = write_files(tmp_path / "src", [([np.arange(3), np.ones((2, 2))], ["a", 7])])
    report = convert(tmp_path / "src", tmp_path / "out", to="filetree")
    assert report.to == "filetree"
    assert "filetree" in available_formats()
    assert format_class("filetree") is FileTreeFormat
    assert json.loads((tmp_path / "out" / "pickleshard.json").read_text())["to"] == "filetree"
    assert sorted(os.listdir(tmp_path / "out" / "samples"))[:2] == [
        "000000000000.x.npy",
        "000000000000.y.txt",
    ]
    ds = open_dataset(tmp_path / "out")
    assert isinstance(ds, FileTreeDataset)
    for i, want in enumerate(oracle_samples(paths)):
        assert_same(ds[i], want, f"sample {i}")


class _Unregistered(FileTreeFormat):
    name = "filetree-unregistered"


class _Impostor(MemmapFormat):
    """Carries the name "memmap" without being the class registered under it."""


@pytest.mark.parametrize(
    ("fmt", "why"),
    [
        (_Unregistered(), "is not registered"),
        (_Unregistered, "is not registered"),
        (_Impostor(), "registered as pickleshard.formats.memmap:MemmapFormat"),
    ],
)
def test_convert_refuses_a_format_open_dataset_could_not_open(
    tmp_path: Path, fmt: Any, why: str
) -> None:
    """open_dataset finds a conversion's format by the name in its descriptor: a format
    instance or class that is not the one registered under its name is refused up front,
    before anything is written, not converted into an output nothing can open."""
    write_files(tmp_path / "src", [([1, 2], [3, 4])])
    with pytest.raises(ValueError, match=why) as info:
        convert(tmp_path / "src", tmp_path / "out", to=fmt)
    assert "register_format" in str(info.value)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / ".out.partial").exists()


def test_registered_classes_and_instances_with_options_are_accepted(tmp_path: Path) -> None:
    pytest.importorskip("lmdb")
    lmdb_format = format_class("lmdb")
    configured = lmdb_format(initial_map_size=1 << 20)
    assert get_format(configured) is configured
    assert type(get_format(lmdb_format)) is lmdb_format
    assert type(get_format("memmap")) is MemmapFormat
    write_files(tmp_path / "src", [([np.arange(4)], [1])])
    convert(tmp_path / "src", tmp_path / "out", to=MemmapFormat)
    assert len(open_dataset(tmp_path / "out")) == 1


def test_open_dataset_names_a_format_this_process_has_not_registered(
    tmp_path: Path, scratch_registry: None
) -> None:
    write_files(tmp_path / "src", [([1, 2], [3, 4])])

    class Scratch(FileTreeFormat):
        name = "scratch-tree"

    register_format(Scratch)
    convert(tmp_path / "src", tmp_path / "out", to="scratch-tree")
    assert len(open_dataset(tmp_path / "out")) == 2
    del registry._classes["scratch-tree"]  # as in a process that never registered it
    with pytest.raises(ConvertedDatasetError, match="unknown format 'scratch-tree'") as info:
        open_dataset(tmp_path / "out")
    assert "pickleshard.json" in str(info.value)
    assert "register_format" in str(info.value)


def test_register_format_checks_the_class_and_its_name(scratch_registry: None) -> None:
    class NoName(FileTreeFormat):
        name = "Not A Name"

    with pytest.raises(ValueError, match="lowercase identifier"):
        register_format(NoName)
    with pytest.raises(TypeError, match="Format subclass"):
        register_format(dict)  # type: ignore[arg-type]

    class Clash(FileTreeFormat):
        name = "memmap"

    with pytest.raises(
        AlreadyRegisteredError, match=r"format 'memmap' is already registered as .*MemmapFormat"
    ) as info:
        register_format(Clash)
    assert isinstance(info.value, ValueError)
    assert "clobber=True" in str(info.value)
    assert format_class("memmap") is MemmapFormat
    assert register_format(FileTreeFormat) is FileTreeFormat  # again: no change
    assert register_format(Clash, clobber=True) is Clash
    assert format_class("memmap") is Clash


def test_builtin_formats_come_first_and_unknown_names_are_refused() -> None:
    assert (
        FORMAT_NAMES
        == tuple(registry.BUILTIN_FORMATS)
        == (
            "memmap",
            "lmdb",
            "webdataset",
            "parquet",
            "arrow",
            "lance",
            "arrayrecord",
        )
    )
    assert available_formats()[: len(FORMAT_NAMES)] == FORMAT_NAMES
    with pytest.raises(ValueError, match="unknown format 'feather'"):
        get_format("feather")
