"""Generated files, compressed each way the package reads: ``ds[i]`` and batches equal
``pickle.load`` of the decompressed file; one shuffled 2-worker DataLoader epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from compressors import COMPRESSORS, SUFFIX, compress_to
from picklegen import assert_same, build, datasets, oracle, write
from pickleshard.dataset import PickleDataset
from pickleshard.errors import UnsupportedLayoutError


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=datasets(), how=st.sampled_from(sorted(COMPRESSORS)))
def test_generated_compressed_files_equal_pickle_load(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any], how: str
) -> None:
    work = tmp_path_factory.mktemp("gen")
    objs = build(data["layout"], data["columns"], data["names"])
    plain = write(work / "plain.pkl", objs, data["protocol"], numpy1=data["numpy1"])
    try:
        fields, want = oracle(plain)  # pickle.load of the decompressed bytes
    except UnsupportedLayoutError:
        assume(False)
    folder = work / "data"
    folder.mkdir()
    compress_to(folder / f"f.pkl{SUFFIX[how]}", plain.read_bytes(), how)
    ds = PickleDataset(folder, jobs=1)
    assert ds.fields == fields
    if "dict" in data["layout"]:  # a dict producer's samples come back as dicts
        want = [dict(zip(fields, s, strict=True)) for s in want]
    assert len(ds) == len(want)
    for i, sample in enumerate(want):
        assert_same(ds[i], sample, _path=f"ds[{i}]")
    order = list(range(len(want)))[::-1]
    for got, i in zip(ds.__getitems__(order), order, strict=True):
        assert_same(got, want[i], _path=f"batch ds[{i}]")


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


@pytest.mark.slow
def test_a_shuffled_two_worker_epoch_reads_every_sample_once(tmp_path: Path) -> None:
    import pickle

    folder = tmp_path / "data"
    folder.mkdir()
    want: dict[int, np.ndarray] = {}
    for k, how in enumerate(["gzip", "bz2", "xz-blocks", "zstd-seekable", "zstd-plain"]):
        xs = [np.full((4, 3), 100 * k + i, dtype=np.float32) for i in range(30)]
        ys = [100 * k + i for i in range(30)]
        want.update(zip(ys, xs, strict=True))
        compress_to(folder / f"part{k}.pkl{SUFFIX[how]}", pickle.dumps((xs, ys), 5), how)
    ds = PickleDataset(folder, jobs=1)
    loader = DataLoader(ds, batch_size=7, shuffle=True, num_workers=2, collate_fn=_as_list)
    seen: list[int] = []
    for batch in loader:
        for x, y in batch:
            assert_same(x, want[y], _path=f"sample y={y}")
            seen.append(y)
    assert sorted(seen) == sorted(want)
