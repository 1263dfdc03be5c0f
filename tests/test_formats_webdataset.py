"""The WebDataset format: the shared kit, the real ``webdataset`` reader, shard sizes, splitting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset as wds

from pickleshard.errors import ConvertedDatasetError
from pickleshard.formats import open_dataset
from pickleshard.formats.webdataset import WebDatasetReader
from pickleshard.pipelines.convert.run import convert
from pickleshard.testing import FormatTests, assert_same, oracle_samples, write_files


class TestWebDatasetFormat(FormatTests):
    format = "webdataset"


class TestWebDatasetFormatWithTinyShards(FormatTests):
    """Every kit test again with shards of at most 12 KiB: most samples cross a shard boundary."""

    format = "webdataset"
    convert_kwargs = {"shard_bytes": 12 << 10}  # noqa: RUF012 - read-only class setting

    # covered with default shards; a second kill run would only cost time
    test_kill_and_resume_gives_the_uninterrupted_output = None  # type: ignore[assignment]


def _convert(tmp_path: Path, objects: list[Any], **kwargs: Any) -> tuple[Path, list[Any]]:
    paths = write_files(tmp_path / "src", objects)
    convert(tmp_path / "src", tmp_path / "out", to="webdataset", **kwargs)
    return tmp_path / "out", oracle_samples(paths)


def _labelled(files: int, per_file: int) -> list[Any]:
    rng = np.random.default_rng(0)
    return [
        ([rng.standard_normal((4, 8)).astype(np.float32) for _ in range(per_file)],
         list(range(f * per_file, (f + 1) * per_file)))
        for f in range(files)
    ]  # fmt: skip


def test_plain_webdataset_decodes_every_sample(tmp_path: Path) -> None:
    out, want = _convert(tmp_path, _labelled(3, 7), shard_bytes=8 << 10, jobs=2)
    desc = json.loads((out / "pickleshard.json").read_text())
    assert len(desc["shards"]) > 1
    got = list(
        wds.WebDataset(str(out / desc["urls"]), shardshuffle=False, empty_check=False).decode()
    )
    assert len(got) == len(want)
    for i, (sample, (x, y)) in enumerate(zip(got, want, strict=True)):
        assert sample["__key__"] == f"{i:010d}"
        assert_same(sample["x.npy"], x)
        assert sample["y.cls"] == y


def test_plain_webdataset_decodes_text_json_scalars_and_pickles(tmp_path: Path) -> None:
    x = [{"text": "a", "ids": [1, 2]}, "plain", (1, b"\x00"), 2.5]
    y = [np.float32(0.5), np.float32(1.5), {3, 4}, [None]]  # a bare None: webdataset keeps bytes
    out, want = _convert(tmp_path, [(x, y)])
    got = list(wds.WebDataset(str(out / "shard-000000.tar"), shardshuffle=False).decode())
    names = [sorted(k for k in sample if not k.startswith("__")) for sample in got]
    assert names == [
        ["x.json", "y.scalar.npy"],
        ["x.txt", "y.scalar.npy"],
        ["x.pickle", "y.pickle"],
        ["x.json", "y.json"],
    ]
    for sample, (wx, wy) in zip(got, want, strict=True):
        # webdataset gives a scalar.npy member as the 0-d array it holds: [()] is the scalar
        plain = {k: v[()] if k.endswith(".scalar.npy") else v for k, v in sample.items()}
        (gx,) = [v for k, v in plain.items() if k.startswith("x.")]
        (gy,) = [v for k, v in plain.items() if k.startswith("y.")]
        assert_same(gx, wx)
        assert_same(gy, wy)


def test_shards_stay_within_shard_bytes(tmp_path: Path) -> None:
    limit = 20 << 10
    out, _ = _convert(tmp_path, _labelled(2, 40), shard_bytes=limit)
    desc = json.loads((out / "pickleshard.json").read_text())
    for shard in desc["shards"]:
        size = (out / shard["name"]).stat().st_size
        assert size == shard["bytes"]
        assert size <= limit or shard["count"] == 1
    assert sum(s["count"] for s in desc["shards"]) == 80


def test_a_sample_larger_than_a_shard_gets_its_own(tmp_path: Path) -> None:
    out, want = _convert(tmp_path, [([np.zeros(50_000), np.zeros(3)], [0, 1])], shard_bytes=1 << 10)
    desc = json.loads((out / "pickleshard.json").read_text())
    assert [s["count"] for s in desc["shards"]] == [1, 1]
    ds = open_dataset(out)
    assert_same(ds[0], want[0])


def _indices(reader: WebDatasetReader, workers: int) -> list[list[int]]:
    return [[i for a, b in reader.runs(w, workers) for i in range(a, b)] for w in range(workers)]


@pytest.mark.parametrize(("world", "workers"), [(1, 1), (2, 1), (2, 3), (3, 2)])
def test_ranks_and_workers_split_an_epoch(tmp_path: Path, world: int, workers: int) -> None:
    out, _ = _convert(tmp_path, _labelled(5, 7), shard_bytes=4 << 10)
    n = 35
    everything: list[int] = []
    for rank in range(world):
        reader = open_dataset(out, rank=rank, world_size=world, seed=1)
        assert isinstance(reader, WebDatasetReader)
        parts = _indices(reader, workers)
        per_rank = sum(len(p) for p in parts)
        assert per_rank == -(-n // world) == reader.samples_per_rank
        everything += [i for p in parts for i in p]
        kept = open_dataset(out, rank=rank, world_size=world, drop_last=True)
        assert sum(len(p) for p in _indices(kept, workers)) == n // world  # type: ignore[arg-type]
    assert set(everything) == set(range(n))
    assert len(everything) - n == -(-n // world) * world - n  # only the padding repeats


def test_iteration_is_a_seeded_shuffle_per_epoch(tmp_path: Path) -> None:
    out, _ = _convert(tmp_path, _labelled(4, 10), shard_bytes=4 << 10)
    reader = open_dataset(out, seed=3, buffer_size=8)
    assert isinstance(reader, WebDatasetReader)
    first = [y for _, y in reader]
    assert first == [y for _, y in reader]
    reader.set_epoch(1)
    second = [y for _, y in reader]
    assert first != second
    assert sorted(first) == sorted(second) == list(range(40))
    ordered = open_dataset(out, shuffle=False)
    assert [y for _, y in ordered] == list(range(40))


def test_a_missing_shard_is_a_clear_error(tmp_path: Path) -> None:
    out, _ = _convert(tmp_path, _labelled(1, 10), shard_bytes=4 << 10)
    (out / "shard-000001.tar").unlink()
    ds = open_dataset(out)
    with pytest.raises(ConvertedDatasetError, match=r"shard-000001\.tar"):
        list(ds)


def test_a_reader_alive_at_interpreter_exit_goes_quietly(tmp_path: Path) -> None:
    """A reader still referenced by a module global when the interpreter exits (its open shards
    are closed by ``__del__`` after ``os`` may be gone) prints no 'Exception ignored'."""
    import subprocess
    import sys

    out, _ = _convert(tmp_path, _labelled(2, 5))
    script = (
        "from pickleshard.formats import open_dataset\n"
        f"ds = open_dataset({str(out)!r})\n"
        "it = iter(ds)\n"
        "first = next(it)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
