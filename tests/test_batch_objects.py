"""Object fields decoded straight into a batch's columns (:mod:`pickleshard.read.objectcolumns`).

Oracles: ``pickle.load`` of each whole file for the samples, ``default_collate([ds[i] ...])``
for the collated batch; the compiled decoder and its Python reference are each held to them,
and to ``bounds.measure`` for the sizes they count."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, default_collate

import pickleshard
from pickleshard import PickleDataset, errors
from pickleshard.picklekit.compiled import CORE
from pickleshard.read.batch import DECODED, OBJECTS
from pickleshard.read.objectcolumns import ObjectColumn
from pickleshard.read.objectdecoder import OD_EXTERNAL, OD_OK, TOKENS, ReferenceDecoder
from pickleshard.safety.bounds import measure
from pickleshard.testing import assert_same
from test_batch import assert_collated

needs_core = pytest.mark.skipif(CORE is None, reason="the compiled core is not built")


def check_batch(ds: PickleDataset, indices: list[int], oracle: list[Any]) -> Any:
    """The batch of ``indices`` against ``pickle.load`` (``oracle``) and ``default_collate``."""
    batch = ds.__getitems__(indices)
    for got, i in zip(list(batch), indices, strict=True):
        assert_collated(got, oracle[i])
    try:
        want = default_collate([ds[i] for i in indices])
    except (RuntimeError, TypeError, ValueError, OverflowError, KeyError) as exc:
        with pytest.raises(type(exc)):
            pickleshard.collate(ds.__getitems__(indices))
        return batch
    assert_collated(pickleshard.collate(ds.__getitems__(indices)), want)
    assert_collated(default_collate(list(ds.__getitems__(indices))), want)
    return batch


# -- values of the grammar, in batches of one shape ---------------------------------------------

KEYS = ["tokens", "text", "score", "a", "b", ""]
LEAVES = ["int", "int", "bool", "float", "str", "bytes", "none"]
shapes = st.recursive(
    st.sampled_from(LEAVES),
    lambda kids: st.one_of(
        st.tuples(st.just("list"), st.lists(kids, max_size=4)),
        st.tuples(st.just("tuple"), st.lists(kids, max_size=4)),
        st.tuples(
            st.just("dict"),
            st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), kids, max_size=4),
        ),
    ),
    max_leaves=12,
)


@st.composite
def leaf(draw: st.DrawFn, kind: str) -> Any:
    if kind == "int":
        return draw(
            st.integers(-300, 70000)
            | st.sampled_from([2**31, -(2**31) - 1, 2**40, 2**63 - 1, -(2**63)])
            | st.integers()
        )
    if kind == "bool":
        return draw(st.booleans())
    if kind == "float":
        return draw(st.floats(allow_nan=True, allow_infinity=True))
    if kind == "str":
        return draw(st.sampled_from(KEYS) | st.text(max_size=8))
    if kind == "bytes":
        return draw(st.binary(max_size=8))
    return None


@st.composite
def value(draw: st.DrawFn, shape: Any) -> Any:
    if isinstance(shape, str):
        return draw(leaf(shape))
    kind, kids = shape
    if kind == "dict":
        return {k: draw(value(v)) for k, v in kids.items()}
    got = [draw(value(k)) for k in kids]
    return got if kind == "list" else tuple(got)


@st.composite
def files(draw: st.DrawFn) -> dict[str, Any]:
    shape = draw(shapes)
    out = []
    for _ in range(draw(st.integers(1, 3))):
        xs = [draw(value(shape)) for _ in range(draw(st.integers(1, 8)))]
        if draw(st.integers(0, 5)) == 0:  # an odd one out: another shape
            xs[draw(st.integers(0, len(xs) - 1))] = draw(value(draw(shapes)))
        out.append(xs)
    return {"files": out, "protocol": draw(st.sampled_from([2, 3, 4, 5]))}


def write(folder: Path, data: dict[str, Any]) -> list[Any]:
    """The files of ``data`` as ``(xs, ys)`` pickles; their samples as ``pickle.load`` gives."""
    folder.mkdir(parents=True, exist_ok=True)
    oracle = []
    for k, xs in enumerate(data["files"]):
        path = folder / f"part{k}.pkl"
        with open(path, "wb") as fh:
            pickle.dump((xs, list(range(len(xs)))), fh, protocol=data["protocol"])
        with open(path, "rb") as fh:
            x, y = pickle.load(fh)
        oracle += list(zip(x, y, strict=True))
    return oracle


@needs_core
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=files(), seed=st.integers(0, 2**16))
def test_batches_of_objects_equal_pickle_load_and_default_collate(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any], seed: int
) -> None:
    folder = tmp_path_factory.mktemp("objects")
    oracle = write(folder, data)
    ds = PickleDataset(folder, jobs=1)
    rng = np.random.default_rng(seed)
    for size in (1, min(4, len(ds)), len(ds)):
        check_batch(ds, rng.permutation(len(ds))[:size].tolist(), oracle)


# -- the two decoders, span by span --------------------------------------------------------------


def _decode(dec: Any, run: Any, externals: dict[int, Any], resolve: Any) -> tuple[int, int]:
    first = 0
    while True:
        answer, first, key = run(dec, first)[:3]
        if answer != OD_EXTERNAL:
            return answer, first
        externals[key] = resolve(key)


@needs_core
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=files())
def test_the_compiled_decoder_and_its_reference_agree_with_the_oracle(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]
) -> None:
    check_twins(tmp_path_factory.mktemp("twins"), data)


def check_twins(folder: Path, data: dict[str, Any]) -> None:
    """:func:`_twins` over every file of ``data`` written to ``folder``, against ``pickle.load``."""
    oracle = write(folder, data)
    ds = PickleDataset(folder, jobs=1)
    ds.__getitems__(list(range(len(ds))))  # every file opened, its plan settled
    first = 0
    for pos in range(len(data["files"])):
        reader = ds.span_files.reader(pos)
        n = len(reader.scan.starts)
        _twins(reader, [x for x, _ in oracle[first : first + n]])
        first += n


def _twins(reader: Any, want: list[Any]) -> bool:
    """Both decoders over every sample of ``reader``'s file (rows reversed): the same answers,
    tables and sizes; the values ``want`` (``pickle.load``'s), sizes ``bounds.measure``'s.
    Whether the rows were decoded as a ragged batch."""
    here, _ = reader.opened()
    fill = here.batch.objects
    if fill is None:  # every value an int: the field is the compiled fill's, no decoder's
        assert all(type(v) is int for v in want)
        return False
    assert fill.usable
    n, scan, spans = len(want), reader.scan, reader.spans
    items, rows = np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)[::-1].copy()
    labels = items.tolist()

    def resolve(key: int) -> Any:
        return spans._external(key, spans._memos())

    cuts, nbytes = np.asarray([0, n], np.int64), np.zeros(1, np.int64)

    def compiled_run(d: Any, j: int) -> Any:
        return d.decode([fill.spans[0]], cuts, items, rows, labels, j, nbytes)

    ext: dict[int, Any] = {}

    def reference_run(d: Any, j: int) -> Any:
        starts, ends, bases = scan.starts[:, 0], scan.ends[:, 0], scan.memo_base[:, 0]
        read = reader.source.read_at
        return d.decode(read, None, starts, ends, bases, items, rows, fill.shift, ext, labels, j)

    compiled, reference = CORE.ObjectDecoder(n), ReferenceDecoder(n)
    got = _decode(compiled, compiled_run, fill.externals, resolve)
    assert got == _decode(reference, reference_run, ext, resolve)
    assert list(compiled.filled) == list(reference.filled)
    assert compiled.ragged == reference.ragged
    if got[0] == OD_OK and compiled.ragged:  # each row's value built by the decoder
        assert compiled.height == reference.height
        _values_as_loaded(compiled, reference, rows, want)
        return True
    if got[0] != OD_OK or ObjectColumn(reference).tree is None:
        return False
    assert list(compiled.schema) == list(reference.schema)
    assert np.array_equal(compiled.vals, reference.vals)
    _values_as_loaded(compiled, reference, rows, want)
    return False


def _values_as_loaded(compiled: Any, reference: Any, rows: Any, want: list[Any]) -> None:
    """Each decoder's values are ``want``'s (``pickle.load``'s), its sizes ``bounds.measure``'s."""
    for dec in (compiled, reference):
        values = ObjectColumn(dec).values()
        for k, w in enumerate(want):
            assert_collated(values[rows[k]], w)
            assert dec.sizes[rows[k]] == measure(w, None, None)[0]


def test_the_token_tables_agree() -> None:
    if CORE is not None:
        assert TOKENS == CORE.OBJECT_TOKENS


# -- the batch path ----------------------------------------------------------------------------


def _objects(folder: Path, n: int = 40, protocol: int = 4) -> list[Any]:
    rng = np.random.default_rng(0)
    xs = [
        {
            "tokens": rng.integers(0, 30000, 16).tolist(),
            "text": f"sample {k}",
            "score": float(rng.random()),
            "ok": bool(k % 2),
            "pair": (k, (b"b" if protocol > 2 else "b") * (k % 3)),  # protocol 2: bytes by REDUCE
        }
        for k in range(n)
    ]
    return write(folder, {"files": [xs[: n // 2], xs[n // 2 :]], "protocol": protocol})


@needs_core
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_batch_of_dicts_is_decoded_into_columns(tmp_path: Path, protocol: int) -> None:
    oracle = _objects(tmp_path / "d", protocol=protocol)
    ds = PickleDataset(tmp_path / "d", jobs=1)
    indices = [3, 31, 0, 22, 7, 39, 20]
    batch = check_batch(ds, indices, oracle)
    assert ds.__getitems__(indices).columns[0].kind == DECODED
    got = pickleshard.collate(batch)
    assert len(got[0]["tokens"]) == 16
    assert got[0]["tokens"][0].dtype == torch.int64
    assert got[0]["text"] == [oracle[i][0]["text"] for i in indices]  # a dict's strings: a list
    assert got[0]["pair"][1] == tuple(
        oracle[i][0]["pair"][1] for i in indices
    )  # a tuple's: a tuple


@needs_core
def test_a_ragged_batch_is_decoded_and_raises_as_default_collate(tmp_path: Path) -> None:
    xs = [{"t": list(range(k % 3))} for k in range(10)]
    oracle = write(tmp_path / "d", {"files": [xs], "protocol": 4})
    ds = PickleDataset(tmp_path / "d", jobs=1)
    batch = check_batch(ds, [0, 1, 2], oracle)  # collate raises as default_collate does
    assert batch.columns[0].kind == DECODED
    assert batch.columns[0].data.decoder.ragged
    check_batch(ds, [0, 3, 6], oracle)  # one shape: decoded
    assert ds.__getitems__([0, 3, 6]).columns[0].kind == DECODED


@needs_core
def test_ints_past_int64_and_none_fall_back(tmp_path: Path) -> None:
    xs = [{"v": 2**64 if k == 2 else k, "n": None} for k in range(6)]
    oracle = write(tmp_path / "d", {"files": [xs], "protocol": 5})
    ds = PickleDataset(tmp_path / "d", jobs=1)
    for indices in ([0, 1], [1, 2, 3]):
        check_batch(ds, indices, oracle)


@needs_core
def test_samples_over_the_bounds_are_refused_in_a_decoded_batch(tmp_path: Path) -> None:
    oracle = _objects(tmp_path / "d")
    sizes = [measure(s, None, None)[0] for s in oracle]
    ds = PickleDataset(tmp_path / "d", jobs=1, max_sample_bytes=max(sizes) - 1)
    with pytest.raises(errors.SampleTooLargeError):
        ds.__getitems__(list(range(len(oracle))))
    ok = PickleDataset(tmp_path / "d", jobs=1, max_sample_bytes=max(sizes))
    assert ok.__getitems__(list(range(len(oracle)))).columns[0].kind == DECODED
    deep = PickleDataset(tmp_path / "d", jobs=1, max_depth=2)  # tuple > dict > list
    with pytest.raises(errors.SampleTooDeepError):
        deep.__getitems__([0, 1])


@needs_core
def test_a_file_changed_since_indexed_is_an_error(tmp_path: Path) -> None:
    _objects(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d", jobs=1)
    ds.__getitems__([0, 1])
    path = tmp_path / "d" / "part0.pkl"
    st_ = path.stat()
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
    with pytest.raises(errors.FileChangedError):
        ds.__getitems__([0, 1])


@needs_core
def test_a_batch_mixing_a_decoded_file_and_a_fallback_one(tmp_path: Path) -> None:
    xs = [{"a": k} for k in range(4)]
    odd = [{"a": k, "b": 1} for k in range(4)]
    oracle = write(tmp_path / "d", {"files": [xs, odd], "protocol": 4})
    ds = PickleDataset(tmp_path / "d", jobs=1)
    check_batch(ds, [0, 5, 1, 6], oracle)  # default_collate keeps the first sample's keys


@needs_core
def test_dataloader_workers_collate_equal_to_default_collate(tmp_path: Path) -> None:
    _objects(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d", jobs=1)
    ours = DataLoader(ds, batch_size=8, collate_fn=pickleshard.collate, num_workers=2)
    theirs = DataLoader(ds, batch_size=8, num_workers=0)
    for got, want in zip(ours, theirs, strict=True):
        assert_collated(got, want)


@needs_core
def test_two_object_fields_each_decoded_batch_after_batch(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    xs = [{"a": k, "s": f"x{k}"} for k in range(12)]
    zs = [[float(k), (k, "z")] for k in range(12)]
    with open(folder / "part0.pkl", "wb") as fh:
        pickle.dump((xs, zs, list(range(12))), fh, protocol=5)
    oracle = list(zip(xs, zs, range(12), strict=True))
    ds = PickleDataset(folder, jobs=1)
    for indices in ([0, 5, 3], [7, 1, 11], [2, 2, 9]):  # later batches reuse the first's shapes
        batch = check_batch(ds, indices, oracle)
        assert [c.kind for c in batch.columns[:2]] == [DECODED, DECODED]


@needs_core
def test_a_decoded_batch_pickles_as_its_values(tmp_path: Path) -> None:
    """A DataLoader worker that returns its batch uncollated pickles it to the loop: the
    decoded columns travel as their values (the compiled decoder does not pickle; the loop hung
    on the worker's failed send)."""
    oracle = _objects(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d", jobs=1)
    indices = [5, 1, 30, 12]
    batch = ds.__getitems__(indices)
    assert batch.columns[0].kind == DECODED
    back = pickle.loads(pickle.dumps(batch))
    assert back.columns[0].kind == OBJECTS
    assert_same(list(back), [oracle[i] for i in indices])
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=lambda b: b)
    got = [s for b in loader for s in b]
    assert_same(got, oracle)


@needs_core
def test_a_shape_nested_past_the_tree_depth_is_read_the_present_way(tmp_path: Path) -> None:
    """A sample nested deeper than the decoder's shape tree goes (deep) is read by the
    reference path: equal to pickle.load within max_depth, SampleTooDeepError past it."""

    def nest(k: int, depth: int) -> Any:
        v: Any = k
        for _ in range(depth):
            v = [v]
        return v

    xs = [nest(k, 100) for k in range(4)]
    oracle = write(tmp_path / "d", {"files": [xs], "protocol": 4})
    ds = PickleDataset(tmp_path / "d", jobs=1, max_depth=200)
    assert_same(list(ds.__getitems__([3, 0])), [oracle[3], oracle[0]])
    shallow = PickleDataset(tmp_path / "d", jobs=1, max_depth=50)
    with pytest.raises(errors.SampleTooDeepError):
        shallow.__getitems__([3, 0])
