"""The batch planned in the compiled call (``_cscan.fill_spans``, ``BatchReader._read_tagged``):
once a batch has tagged its files' column plan, later batches are sorted, grouped by file and
read there. Oracles: ``pickle.load`` of each file for the samples, ``default_collate`` of
``ds[i]`` for the collated batch (``check_batch``); every check still on."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pickleshard import PickleDataset, errors
from pickleshard.picklekit.compiled import CORE
from pickleshard.read import batchread
from pickleshard.testing import assert_same
from test_batch import _loaded, check_batch, flip_byte_in_place

pytestmark = pytest.mark.skipif(CORE is None, reason="the compiled core is not built")


class Planned:
    """Counts the batches planned in Python (the compiled call refused them, or none tagged)."""

    def __init__(self, ds: PickleDataset, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        reader = ds._batches
        planned = reader._read_planned

        def counted(*args: Any) -> Any:
            self.calls += 1
            return planned(*args)

        monkeypatch.setattr(reader, "_read_planned", counted)


def _files(
    folder: Path, dtype: str, shape: tuple[int, ...], sizes: list[int], protocol: int
) -> None:
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(len(sizes))
    for k, n in enumerate(sizes):
        xs = [rng.integers(-100, 100, shape).astype(dtype) for _ in range(n)]
        ys = [int(v) for v in rng.integers(-5, 1000, n)]
        with open(folder / f"part{k}.pkl", "wb") as fh:
            pickle.dump((xs, ys), fh, protocol=protocol)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    dtype=st.sampled_from(["<f4", "<i8", "|u1", "<f2", ">f4", ">i2"]),
    shape=st.lists(st.integers(1, 6), min_size=0, max_size=3).map(tuple),
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=4),
    protocol=st.sampled_from([2, 3, 4, 5]),
    seed=st.integers(0, 2**16),
)
def test_compiled_batches_equal_pickle_load_and_default_collate(
    tmp_path_factory: pytest.TempPathFactory,
    dtype: str,
    shape: tuple[int, ...],
    sizes: list[int],
    protocol: int,
    seed: int,
) -> None:
    folder = tmp_path_factory.mktemp("compiled")
    _files(folder, dtype, shape, sizes, protocol)
    ds = PickleDataset(folder, jobs=1)
    want = [s for p in sorted(folder.glob("*.pkl")) for s in _loaded(p, "columns")]
    n = len(ds)
    rng = np.random.default_rng(seed)
    check_batch(ds, list(range(n)))  # every file opened: the plan is tagged now
    for _ in range(3):
        size = int(rng.integers(1, 2 * n + 1))
        indices = rng.integers(-n, n, size).tolist()  # repeats and negative ones too
        batch = check_batch(ds, indices)
        for got, i in zip(batch, indices, strict=True):
            assert_same(got, tuple(want[i]))
        as_array = ds.__getitems__(np.asarray(indices))  # numpy indices: the same batch
        for got, same in zip(as_array, batch, strict=True):
            assert_same(got, same)


def test_later_batches_are_planned_in_the_compiled_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _files(tmp_path / "d", "<f4", (3, 4), [40, 40, 40], 4)
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, list(range(120)))
    planned = Planned(ds, monkeypatch)
    for k in range(8):
        check_batch(ds, np.random.default_rng(k).permutation(120)[:16].tolist())
    assert planned.calls == 0


def test_compiled_batches_count_their_reads_as_planned_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _files(tmp_path / "d", "<f4", (3, 4), [40, 40, 40], 4)
    both = [PickleDataset(tmp_path / "d") for _ in range(2)]
    monkeypatch.setattr(both[1]._batches, "_tag", lambda plans: None)  # planned in Python
    for ds in both:
        ds.__getitems__(list(range(120)))
        for k in range(8):
            ds.__getitems__(np.random.default_rng(k).permutation(120)[:16].tolist())
    assert both[0]._batches._tagged is not None
    counted = [[vars(ds.span_files.reader(k).stats) for k in range(3)] for ds in both]
    assert counted[0] == counted[1]
    assert all(c["array_items"] > 40 for c in counted[0])  # more than the first batch


def test_closed_files_and_bad_indices_are_planned_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _files(tmp_path / "d", "<f4", (5,), [10, 10], 4)
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, list(range(20)))
    planned = Planned(ds, monkeypatch)
    ds.span_files.close()  # the records retire with their files
    check_batch(ds, [3, 15, 7])
    assert planned.calls == 1
    check_batch(ds, [4, 16])  # reopened and recorded again
    assert planned.calls == 1
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([1, 20])
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([-21])
    check_batch(ds, [np.int64(3), 5])  # not a plain int: planned in Python, the same batch
    assert len(ds.__getitems__([])) == 0


def test_a_changed_framing_byte_is_found_in_a_compiled_batch(tmp_path: Path) -> None:
    _files(tmp_path / "d", "<f4", (3, 4), [10], 4)
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, list(range(10)))
    path = tmp_path / "d" / "part0.pkl"
    start = int(ds.span_files.reader(0).scan.starts[6, 0])
    flip_byte_in_place(path, start)  # the framing byte of sample 6
    with pytest.raises(errors.FileChangedError) as info:
        ds.__getitems__([2, 6, 9])
    assert info.value.sample == 6


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_every_framing_byte_before_and_after_a_payload_is_checked(
    tmp_path: Path, protocol: int
) -> None:
    """Read out of the file's mapping, a sample's framing is compared in place (protocols 4 and
    5: no masked ranges) or copied for the full check (protocol 3: memo indices masked): a
    change of any byte of it outside the masked ranges, before its payload or after, fails the
    batch naming the sample."""
    _files(tmp_path / "d", "<f4", (3, 4), [10], protocol)
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, list(range(10)))
    assert ds._batches._fills[0].mapped is not None  # the mapped path
    path = tmp_path / "d" / "part0.pkl"
    reader = ds.span_files.reader(0)
    spec = reader.plan.readers[0].spec
    start, end = int(reader.scan.starts[6, 0]), int(reader.scan.ends[6, 0])
    payload = len(spec.head), end - start - len(spec.tail)
    masked = {start + p for lo, hi in spec.head_masked for p in range(lo, hi)}
    masked |= {start + payload[1] + p for lo, hi in spec.tail_masked for p in range(lo, hi)}
    framing = [p for p in range(start, end) if not payload[0] <= p - start < payload[1]]
    checked = [p for p in framing if p not in masked]
    assert len(checked) >= len(framing) // 2
    for at in checked:
        flip_byte_in_place(path, at)
        with pytest.raises(errors.FileChangedError, match="bytes around its array") as info:
            ds.__getitems__([2, 6, 9])
        assert info.value.sample == 6
        flip_byte_in_place(path, at)  # back as it was: its framing passes, its new ctime does not
        with pytest.raises(errors.FileChangedError, match="its ctime"):
            ds.__getitems__([2, 6, 9])


def test_framing_with_frame_headers_between_samples_reads_as_pickle_load(
    tmp_path: Path,
) -> None:
    """12 KB arrays at protocol 4: a FRAME header lands after some samples' payloads (9 bytes
    more than the template's tail), which the in-place compare leaves to the full check."""
    _files(tmp_path / "d", "<f4", (3, 32, 32), [60], 4)
    ds = PickleDataset(tmp_path / "d")
    want = _loaded(tmp_path / "d" / "part0.pkl", "columns")
    check_batch(ds, list(range(60)))
    reader = ds.span_files.reader(0)
    spec = reader.plan.readers[0].spec
    tails = reader.scan.ends[:, 0] - reader.scan.starts[:, 0] - len(spec.head) - 12288
    assert (tails == len(spec.tail) + 9).any()  # some samples' tails hold a FRAME header
    order = np.random.default_rng(0).permutation(60).tolist()
    for k in range(0, 60, 20):
        for got, w in zip(
            ds.__getitems__(order[k : k + 20]), [want[i] for i in order[k : k + 20]], strict=True
        ):
            assert_same(got, w)


def test_a_file_replaced_under_a_compiled_batch_is_an_error(tmp_path: Path) -> None:
    _files(tmp_path / "d", "<f4", (64, 64), [100], 4)
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, list(range(0, 100, 7)))
    path = tmp_path / "d" / "part0.pkl"
    os.truncate(path, os.path.getsize(path) // 2)  # cut short under its mapping: no SIGBUS
    with pytest.raises(errors.PickleshardError) as info:
        ds.__getitems__([10, 90, 95])
    assert str(path) in str(info.value)


def test_streamed_and_advised_batches_read_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _files(tmp_path / "d", "<f4", (37, 29), [50, 50], 5)
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, list(range(100)))
    monkeypatch.setattr(batchread, "STREAM_BYTES", 0)  # every copy by non-temporal stores
    indices = np.random.default_rng(5).permutation(100)[:64].tolist()
    check_batch(ds, indices)
    ds._batches.cold = True  # as after a batch that came from the device: spans advised first
    check_batch(ds, indices[::-1])
