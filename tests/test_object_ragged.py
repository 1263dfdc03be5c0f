"""Ragged object batches: samples of differing shapes decoded in the compiled loop, each row's
value built by the decoder (:mod:`pickleshard.read.objectcolumns`, ``_cscan.ObjectDecoder``
and its twin :class:`~pickleshard.read.objectdecoder.ReferenceDecoder`).

Oracles: ``pickle.load`` of each whole file for the values, ``default_collate`` of the samples
read one by one for the collated batch (it raises for ragged lists: the same exception type)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pickleshard
from pickleshard import PickleDataset, errors
from pickleshard.read.batch import DECODED
from pickleshard.safety.bounds import measure
from test_batch import assert_collated
from test_batch_objects import _twins, check_batch, check_twins, needs_core, write

KEYS = ["tokens", "text", "score", "label", "id"]  # repeated across samples: memo'd keys

leaves = (
    st.integers(-(2**63), 2**63 - 1)
    | st.integers(-300, 70000)
    | st.booleans()
    | st.floats(allow_nan=False)
    | st.sampled_from(KEYS)
    | st.text(max_size=6)
    | st.binary(max_size=6)
    | st.none()
)
ragged = st.recursive(
    leaves,
    lambda kids: (
        st.lists(kids, max_size=6)
        | st.lists(kids, max_size=4).map(tuple)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), kids, max_size=4)
    ),
    max_leaves=16,
)
# the suite's samples: a ragged token list, a string and a float
suite_like = st.fixed_dictionaries(
    {
        "tokens": st.lists(st.integers(0, 2**31 - 1), min_size=0, max_size=20),
        "text": st.sampled_from(KEYS) | st.text(max_size=8),
        "score": st.floats(allow_nan=False),
    }
)


@st.composite
def ragged_files(draw: st.DrawFn) -> dict[str, Any]:
    sample = draw(st.sampled_from([ragged, suite_like]))
    out = [draw(st.lists(sample, min_size=1, max_size=10)) for _ in range(draw(st.integers(1, 3)))]
    return {"files": out, "protocol": draw(st.sampled_from([2, 3, 4, 5]))}


@needs_core
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=ragged_files(), seed=st.integers(0, 2**16))
def test_ragged_batches_equal_pickle_load_and_default_collate(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any], seed: int
) -> None:
    folder = tmp_path_factory.mktemp("ragged")
    oracle = write(folder, data)
    ds = PickleDataset(folder, jobs=1)
    rng = np.random.default_rng(seed)
    for size in (min(2, len(ds)), min(5, len(ds)), len(ds)):
        check_batch(ds, rng.permutation(len(ds))[:size].tolist(), oracle)


@needs_core
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=ragged_files())
def test_the_twins_build_ragged_rows_as_pickle_load(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]
) -> None:
    check_twins(tmp_path_factory.mktemp("twins"), data)


def _suite(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "tokens": rng.integers(0, 50000, int(rng.integers(4, 17))).tolist(),
            "text": f"sample {k}",
            "score": float(rng.random()),
        }
        for k in range(n)
    ]


@needs_core
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_the_suites_ragged_samples_are_decoded_across_frames(tmp_path: Path, protocol: int) -> None:
    """Files past one 64 KiB frame: spans cross FRAME opcodes, keys are memo GETs."""
    xs = _suite(3000)
    oracle = write(tmp_path / "d", {"files": [xs[:1500], xs[1500:]], "protocol": protocol})
    assert (tmp_path / "d" / "part0.pkl").stat().st_size > 1 << 16
    ds = PickleDataset(tmp_path / "d", jobs=1)
    rng = np.random.default_rng(protocol)
    for _ in range(3):
        indices = rng.permutation(len(ds))[:64].tolist()
        batch = check_batch(ds, indices, oracle)
        col = batch.columns[0]
        assert col.kind == DECODED
        assert col.data.decoder.ragged
        with pytest.raises(RuntimeError):  # default_collate's, for lists of unequal size
            pickleshard.collate(ds.__getitems__(indices))


@needs_core
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_the_twins_agree_on_the_suites_ragged_samples(tmp_path: Path, protocol: int) -> None:
    xs = [*_suite(300), [1, {"a": None}], (1.5, "x", True)]  # (protocol 2 bytes: a global)
    oracle = write(tmp_path / "d", {"files": [xs], "protocol": protocol})
    ds = PickleDataset(tmp_path / "d", jobs=1)
    ds.__getitems__(list(range(len(ds))))
    assert _twins(ds.span_files.reader(0), [x for x, _ in oracle])


@needs_core
def test_rows_decoded_before_the_batch_turned_ragged_keep_their_values(tmp_path: Path) -> None:
    """Samples of one shape first (held in the table), then one of another: every row's value
    built, leaves of every kind included."""
    same = [
        {"a": k, "f": k / 3, "b": k % 2 == 0, "s": f"s{k}", "y": b"y", "n": None} for k in range(5)
    ]
    odd = [{"a": [1, 2, 3]}, ("t", 1.5), [None, True]]
    oracle = write(tmp_path / "d", {"files": [same, odd], "protocol": 5})
    ds = PickleDataset(tmp_path / "d", jobs=1)
    batch = check_batch(ds, [0, 1, 2, 3, 4, 5, 6, 7], oracle)
    assert batch.columns[0].data.decoder.ragged
    check_batch(ds, [7, 0, 6, 1], oracle)


@needs_core
def test_a_memo_shared_string_is_one_object_as_pickle_load_gives(tmp_path: Path) -> None:
    xs = [{"a": s, "b": s, "c": [s] * k} for k, s in enumerate(["x" * 20, "y" * 30, "z" * 5])]
    oracle = write(tmp_path / "d", {"files": [xs], "protocol": 4})
    ds = PickleDataset(tmp_path / "d", jobs=1)
    batch = ds.__getitems__([0, 1, 2])
    assert batch.columns[0].data.decoder.ragged
    for (x, _), (want, _) in zip(batch, oracle, strict=True):
        assert_collated(x, want)
        assert (x["a"] is x["b"]) == (want["a"] is want["b"])


@needs_core
def test_ragged_samples_over_the_bounds_are_refused(tmp_path: Path) -> None:
    xs = [[k] * k for k in range(1, 9)] + [[[[1]]]]
    oracle = write(tmp_path / "d", {"files": [xs], "protocol": 4})
    sizes = [measure(s, None, None)[0] for s in oracle]
    small = PickleDataset(tmp_path / "d", jobs=1, max_sample_bytes=max(sizes) - 1)
    with pytest.raises(errors.SampleTooLargeError):
        small.__getitems__(list(range(len(oracle))))
    ok = PickleDataset(tmp_path / "d", jobs=1, max_sample_bytes=max(sizes))
    batch = ok.__getitems__(list(range(len(oracle))))
    assert batch.columns[0].data.decoder.ragged
    deep = PickleDataset(tmp_path / "d", jobs=1, max_depth=3)  # tuple > list > list > list
    with pytest.raises(errors.SampleTooDeepError):
        deep.__getitems__([0, 8])
    assert_collated(list(deep.__getitems__([0, 1])), [oracle[0], oracle[1]])


@needs_core
def test_a_ragged_batch_pickles_as_its_values(tmp_path: Path) -> None:
    oracle = write(tmp_path / "d", {"files": [_suite(40)], "protocol": 5})
    ds = PickleDataset(tmp_path / "d", jobs=1)
    batch = ds.__getitems__([3, 9, 1])
    assert batch.columns[0].data.decoder.ragged
    assert_collated(list(pickle.loads(pickle.dumps(batch))), [oracle[i] for i in (3, 9, 1)])


@needs_core
def test_a_changed_file_of_two_object_fields_is_an_error(tmp_path: Path) -> None:
    """Its identity is checked once a batch, after the last field's reads: still checked."""
    folder = tmp_path / "d"
    folder.mkdir()
    xs, zs = _suite(12), [[k] * k for k in range(12)]
    with open(folder / "part0.pkl", "wb") as fh:
        pickle.dump((xs, zs, list(range(12))), fh, protocol=5)
    ds = PickleDataset(folder, jobs=1)
    got = ds.__getitems__([3, 0, 7])
    assert [c.kind for c in got.columns[:2]] == [DECODED, DECODED]
    assert_collated(list(got), [(xs[i], zs[i], i) for i in (3, 0, 7)])
    st_ = (folder / "part0.pkl").stat()
    os.utime(folder / "part0.pkl", ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
    with pytest.raises(errors.FileChangedError):
        ds.__getitems__([3, 0, 7])


@needs_core
def test_files_after_a_declined_one_are_read_by_the_reference(tmp_path: Path) -> None:
    """Three files in one batch, the middle one holding an int past int64 (outside the
    grammar): the first decoded, the rest read the present way, the int labels in place."""
    files = [_suite(5, 1), [*_suite(4, 2), {"tokens": [2**70]}], _suite(5, 3)]
    oracle = write(tmp_path / "d", {"files": files, "protocol": 4})
    ds = PickleDataset(tmp_path / "d", jobs=1)
    check_batch(ds, [12, 0, 9, 4, 5, 13, 2, 7], oracle)
    check_batch(ds, [1, 3, 11, 14], oracle)
