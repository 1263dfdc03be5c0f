"""The LMDB format: the shared kit, plain ``lmdb`` reading, map growth, and the install hint."""

from __future__ import annotations

import gc
import json
import re
import sys
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest

from pickleshard.errors import ConvertedDatasetError, MissingDependencyError
from pickleshard.formats import get_format, open_dataset
from pickleshard.formats.lmdb import LmdbFormat
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.verify.run import verify
from pickleshard.testing import FormatTests, assert_same, oracle_samples, write_files


class TestLmdbFormat(FormatTests):
    format = "lmdb"


class TestLmdbFormatWithATinyMap(FormatTests):
    """Every kit test again, starting from a 64 KiB map that must grow many times."""

    def make_format(self) -> LmdbFormat:
        return LmdbFormat(initial_map_size=64 << 10)

    # the map size is recorded in data.mdb, so outputs differ from the default run's bytes
    test_kill_and_resume_gives_the_uninterrupted_output = None  # type: ignore[assignment]
    test_dataloader_sees_every_sample_once = None  # type: ignore[assignment]


DOCS = Path(__file__).resolve().parents[1] / "docs" / "formats.md"


def _docs_snippet() -> str:
    """The plain LMDB reader of docs/formats.md, as written there."""
    text = DOCS.read_text()
    block = re.search(r"\*\*LMDB\*\*.*?```python\n(.*?)```", text, re.S)
    assert block is not None
    return block.group(1)


def _objects() -> list[Any]:
    rng = np.random.default_rng(0)
    x = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(5)]
    y = [7, "text", {"a": [1, None]}, np.float32(2.5), (1, b"\x00")]
    more = ([np.arange(k, dtype=np.int16) for k in range(3)], [2.5, 2**3000, {3, 4}])
    return [(x, y), more]


def test_the_documented_plain_reader_decodes_every_sample_then_open_dataset_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_files(tmp_path / "src", _objects())
    convert(tmp_path / "src", tmp_path / "out", to="lmdb", jobs=2)
    want = oracle_samples(paths)
    monkeypatch.chdir(tmp_path)  # the snippet opens "out"
    scope: dict[str, Any] = {}
    exec(
        _docs_snippet(), scope
    )  # reads sample 123 of a bigger dataset: here, an IndexError-free miss
    assert scope["sample"] == {}
    with lmdb.open("out", readonly=True, lock=False) as env, env.begin() as txn:
        for i, sample in enumerate(want):
            got = scope["read_sample"](txn, i)
            assert_same((got["x"], got["y"]), sample, f"sample {i}")
        meta = json.loads(txn.get(b"__pickleshard__"))
        assert meta["num_samples"] == len(want)
        assert [f["name"] for f in meta["fields"]] == ["x", "y"]
        assert txn.stat()["entries"] == 2 * len(want) + 1
    # the same process, after the plain reader: pickleshard opens it too, and lets it go again
    ds = open_dataset("out", shuffle=False)
    for i, sample in enumerate(want):
        assert_same(ds[i], sample, f"sample {i}")
    with ds.env.begin() as txn:  # type: ignore[attr-defined]
        assert_same(scope["read_sample"](txn, 0)["y"], 7)
    del ds, txn
    gc.collect()
    with lmdb.open("out", readonly=True, lock=False) as env, env.begin() as txn:
        assert scope["read_sample"](txn, 1)["y"] == "text"


def test_an_lmdb_handle_of_ones_own_left_open_is_named_with_the_fix(tmp_path: Path) -> None:
    write_files(tmp_path / "src", [([1, 2], [3, 4])])
    convert(tmp_path / "src", tmp_path / "out", to="lmdb")
    env = lmdb.open(str(tmp_path / "out"), readonly=True, lock=False)
    try:
        with pytest.raises(ConvertedDatasetError, match=r"close your own lmdb.Environment"):
            open_dataset(tmp_path / "out")
    finally:
        env.close()
    assert open_dataset(tmp_path / "out")[1] == (2, 4)


def test_keys_are_webdataset_member_names(tmp_path: Path) -> None:
    write_files(tmp_path / "src", [([np.zeros(2), np.ones(2)], [1, "b"])])
    convert(tmp_path / "src", tmp_path / "out", to="lmdb")
    with lmdb.open(str(tmp_path / "out"), readonly=True, lock=False) as env, env.begin() as txn:
        keys = [bytes(k) for k, _ in txn.cursor()]
    assert keys == [
        b"0000000000.x.npy", b"0000000000.y.cls", b"0000000001.x.npy", b"0000000001.y.txt",
        b"__pickleshard__",
    ]  # fmt: skip


def test_a_growing_map_gives_the_same_content(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    write_files(
        tmp_path / "src", [([rng.standard_normal(500) for _ in range(40)], list(range(40)))]
    )
    convert(tmp_path / "src", tmp_path / "tiny", to=LmdbFormat(initial_map_size=16 << 10))
    convert(tmp_path / "src", tmp_path / "default", to="lmdb")
    assert (tmp_path / "tiny" / "hashes.npy").read_bytes() == (
        tmp_path / "default" / "hashes.npy"
    ).read_bytes()
    assert verify(tmp_path / "src", tmp_path / "tiny").checked == 40


def test_missing_lmdb_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lmdb", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'pickleshard\[lmdb\]'") as info:
        get_format("lmdb")
    assert isinstance(info.value, ImportError)


def test_a_damaged_or_missing_value_names_the_sample(tmp_path: Path) -> None:
    write_files(tmp_path / "src", [([1, 2, 3], [4, 5, 6])])
    convert(tmp_path / "src", tmp_path / "out", to="lmdb")
    env = lmdb.open(str(tmp_path / "out"), lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"0000000001.y.cls", b"garbage")
        txn.delete(b"0000000002.x.cls")
    env.close()
    ds = open_dataset(tmp_path / "out")
    with pytest.raises(ConvertedDatasetError, match="not a decimal integer") as info:
        ds[1]
    assert info.value.sample == 1
    with pytest.raises(ConvertedDatasetError, match="found 1 of the sample's 2 keys") as missing:
        ds[2]
    assert missing.value.sample == 2
