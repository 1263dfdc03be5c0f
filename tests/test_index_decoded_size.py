"""The index's decoded size of a span-indexed file, which the whole-file cache and
BlockShuffleSampler budget by: close to the whole-file measure for Python-object samples too
(pickled bytes alone undercount them 4-5x), so a whole-file epoch holds to its budget."""

from __future__ import annotations

import pickle
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import BlockShuffleSampler, PickleDataset, build_index
from pickleshard.indexing import describe
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.read.whole.cache import estimate_nbytes

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]


def _dicts(n: int) -> list[Any]:
    return [
        {"tokens": list(range(i % 29)), "text": WORDS[i % 5] * (i % 7), "score": i / 3}
        for i in range(n)
    ]


def _ints(n: int) -> list[Any]:
    return [i * 7 % 1000 for i in range(n)]


def _short_strings(n: int) -> list[Any]:
    return [f"id-{i}" for i in range(n)]


def _nested(n: int) -> list[Any]:
    return [([i, i + 1], (str(i), {"k": [float(i)] * (i % 5)})) for i in range(n)]


@pytest.mark.parametrize("make", [_dicts, _ints, _short_strings, _nested])
def test_span_file_decoded_size_is_close_to_the_whole_file_measure(
    tmp_path: Path, make: Any
) -> None:
    n = 3000
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "part.pkl", "wb") as fh:
        pickle.dump((make(n), [i % 10 for i in range(n)]), fh, protocol=4)
    entry = build_index(data, jobs=1).files[0]
    assert entry.mode == "span"
    with open(data / "part.pkl", "rb") as fh:
        measured = estimate_nbytes(pickle.load(fh))  # what a whole-file index records
    assert 0.6 * measured <= entry.decoded_nbytes <= 1.6 * measured, (
        entry.decoded_nbytes,
        measured,
    )


def test_whole_file_epoch_over_object_samples_holds_its_cache_budget(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "data", files=8, per_file=2000, kind="objects", seed=3)
    with open(next((tmp_path / "data").glob("*.pkl")), "rb") as fh:
        per_file = estimate_nbytes(pickle.load(fh))
    budget = 2 * per_file  # two files of the eight
    ds = PickleDataset(tmp_path / "data", mode="whole", cache_bytes=budget)
    sampler = BlockShuffleSampler(ds, batch_size=32, cache_bytes=budget, seed=1)
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        seen = 0
        for i in sampler:
            ds[i]
            seen += 1
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    assert seen == len(ds)
    assert ds.cache_stats.loads == 8  # each file once: blocks planned by the same sizes
    # the budget, the file being loaded past it, and the sampler's own arrays; holding all eight
    # decoded files (what a 4-5x undercount of their size lets in) is far above
    assert peak < budget + 2 * per_file, (peak, budget, per_file)


def test_arrays_and_int_labels_are_sized_without_reading_a_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Array items count their payloads and int items their count: nothing is read to size
    them, and the total stays close to the whole-file measure."""
    data = tmp_path / "data"
    data.mkdir()
    xs = [np.full((3, 4), i, np.float32) for i in range(3000)]
    with open(data / "part.pkl", "wb") as fh:
        pickle.dump((xs, [i * 7 % 1000 for i in range(3000)]), fh, protocol=5)

    def no_read(*args: Any) -> None:
        raise AssertionError("a sample was read to size the file")

    monkeypatch.setattr(describe, "_decoded_sizes", no_read)
    entry = build_index(data, jobs=1).files[0]
    with open(data / "part.pkl", "rb") as fh:
        measured = estimate_nbytes(pickle.load(fh))
    assert 0.8 * measured <= entry.decoded_nbytes <= 1.25 * measured, (
        entry.decoded_nbytes,
        measured,
    )
