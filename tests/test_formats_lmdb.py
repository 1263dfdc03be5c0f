"""The LMDB format: the shared kit, plain ``lmdb`` reading, map growth, and the install hint."""

from __future__ import annotations

import io
import json
import struct
import sys
from pathlib import Path

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


def _plain_decode(value: bytes) -> tuple[object, ...]:
    """Decode a value with struct, numpy and json only: the documented scheme."""
    assert value[:4] == b"PSL1"
    (nf,) = struct.unpack_from("<H", value, 4)
    pos = 6 + 9 * nf
    out: list[object] = []
    for k in range(nf):
        kind, n = struct.unpack_from("<BQ", value, 6 + 9 * k)
        payload = value[pos : pos + n]
        pos += n
        if kind == 0:
            out.append(np.load(io.BytesIO(payload), allow_pickle=False))
        elif kind == 2:
            out.append(int(payload))
        elif kind == 3:
            out.append(json.loads(payload))
        else:
            raise AssertionError(f"unexpected kind {kind}")
    return tuple(out)


def test_plain_lmdb_reads_every_sample(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    objects = [([rng.standard_normal((2, 3)) for _ in range(5)], [{"a": k} for k in range(5)])]
    objects.append(([rng.standard_normal((2, 3)) for _ in range(3)], [{"b": None}] * 3))
    paths = write_files(tmp_path / "src", objects)
    convert(tmp_path / "src", tmp_path / "out", to="lmdb", jobs=2)
    env = lmdb.open(str(tmp_path / "out"), readonly=True, lock=False)
    with env.begin() as txn:
        meta = json.loads(txn.get(b"__pickleshard__"))
        assert meta == {"num_samples": 8, "fields": ["x", "y"]}
        for i, sample in enumerate(oracle_samples(paths)):
            assert_same(_plain_decode(txn.get(i.to_bytes(8, "big"))), sample, f"sample {i}")
        assert txn.stat()["entries"] == 9
    env.close()


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


def test_a_damaged_value_names_the_sample(tmp_path: Path) -> None:
    write_files(tmp_path / "src", [([1, 2, 3], [4, 5, 6])])
    convert(tmp_path / "src", tmp_path / "out", to="lmdb")
    env = lmdb.open(str(tmp_path / "out"), lock=False)
    with env.begin(write=True) as txn:
        txn.put((1).to_bytes(8, "big"), b"PSL1\x02\x00garbage")
        txn.delete((2).to_bytes(8, "big"))
    env.close()
    ds = open_dataset(tmp_path / "out")
    with pytest.raises(ConvertedDatasetError) as info:
        ds[1]
    assert info.value.sample == 1
    with pytest.raises(ConvertedDatasetError, match="no value") as missing:
        ds[2]
    assert missing.value.sample == 2
