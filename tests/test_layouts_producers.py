"""What ``layout="auto"`` reads common producers' files as, and the type samples come back in
(issue 27): RL transitions and ``(image, mask)`` records appended one ``pickle.dump`` each are
one sample per record; one ``{"image": ..., "label": 3}`` per file is one sample that keeps its
label; CIFAR-10 as downloaded (files without an extension) is found by its first bytes; dict
producers get dicts back, tuple producers tuples, through span reads, whole-file reads,
``default_collate`` and a converted copy. ``pickle.load`` is the oracle throughout."""

from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layouts_cifar import cifar_batch, py2_dumps
from pickleshard import AmbiguousLayoutWarning, PickleDataset, build_index
from pickleshard.errors import IndexFormatError, NoPickleFilesError
from pickleshard.io.filenames import starts_like_pickle
from pickleshard.io.listing import resolve_source
from pickleshard.testing import same


def _records(path: Path) -> list[Any]:
    """Every pickle of ``path``, by ``pickle.load`` alone: the oracle."""
    out = []
    with open(path, "rb") as f:
        while f.peek(1):
            out.append(pickle.load(f))
    return out


def _open(root: Path | str, **kw: Any) -> tuple[PickleDataset, list[str]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ds = PickleDataset(root, jobs=1, **kw)
    return ds, [str(w.message) for w in seen if issubclass(w.category, AmbiguousLayoutWarning)]


def _check_both_modes(root: Path, want: list[Any]) -> None:
    """The dataset at ``root`` reads ``want`` exactly, sample by sample and by batch, in span
    and in whole-file mode, with no ambiguity warning."""
    for mode in ("auto", "whole"):
        ds, seen = _open(root, mode=mode)
        assert not seen, seen
        assert len(ds) == len(want)
        assert all(same(ds[i], w) for i, w in enumerate(want))
        order = list(range(len(want)))[::-1]
        assert all(same(s, want[i]) for s, i in zip(ds.__getitems__(order), order, strict=True))


RNG = np.random.default_rng(27)


def _appended(root: Path, objs: list[Any], protocol: int = 4) -> Path:
    root.mkdir()
    with open(root / "a.pkl", "wb") as f:
        for o in objs:
            pickle.dump(o, f, protocol=protocol)
    return root


def test_rl_transitions_are_one_sample_per_record(tmp_path: Path) -> None:
    objs = [{"obs": RNG.random(8), "next_obs": RNG.random(8)} for _ in range(120)]
    root = _appended(tmp_path / "rl", objs)
    _check_both_modes(root, _records(root / "a.pkl"))
    ds, _ = _open(root)
    assert ds.fields == ("obs", "next_obs")
    assert ds.index.header["sample_form"] == "dict"


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_image_mask_records_are_one_sample_per_record(tmp_path: Path, protocol: int) -> None:
    objs = [
        (RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8), RNG.random((32, 32)) > 0.5)
        for _ in range(30)
    ]
    root = _appended(tmp_path / "im", objs, protocol)
    _check_both_modes(root, _records(root / "a.pkl"))


def test_one_image_and_label_per_file_keeps_the_label(tmp_path: Path) -> None:
    root = tmp_path / "per_file"
    root.mkdir()
    want = []
    for i in range(6):
        obj = {"image": RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8), "label": i % 3}
        (root / f"{i}.pkl").write_bytes(pickle.dumps(obj, protocol=5))
        want.append(obj)
    _check_both_modes(root, want)
    ds, _ = _open(root)
    assert ds.fields == ("image", "label")
    assert ds.file_metadata(0) == {}  # the label stayed in the sample
    assert [ds[i]["label"] for i in range(6)] == [0, 1, 2, 0, 1, 2]


def test_arrays_of_different_first_dimensions_are_one_sample(tmp_path: Path) -> None:
    root = tmp_path / "diff"
    root.mkdir()
    obj = (RNG.random((32, 32, 3)), RNG.random((16, 16)))
    (root / "0.pkl").write_bytes(pickle.dumps(obj, protocol=4))
    _check_both_modes(root, [obj])


def test_chunks_of_many_samples_stay_columns(tmp_path: Path) -> None:
    """Chunked ``(X, y)`` writes of more than a few samples: one reading only, no warning."""
    objs = [(RNG.random((100, 3, 4)), RNG.integers(0, 9, 100)) for _ in range(3)]
    root = _appended(tmp_path / "chunks", objs)
    want = [(x[i], y[i]) for x, y in objs for i in range(100)]
    _check_both_modes(root, want)


arrays = st.integers(1, 64).flatmap(
    lambda n: st.lists(
        st.tuples(st.sampled_from(["f4", "u1", "i8"]), st.lists(st.integers(1, 4), max_size=2)),
        min_size=1,
        max_size=3,
    ).map(lambda fields: [(n, dt, tuple(tail)) for dt, tail in fields])
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shapes=arrays, count=st.integers(2, 6), keyed=st.booleans(), protocol=st.sampled_from([4, 5])
)
def test_appended_records_of_small_arrays_are_records(
    tmp_path_factory: pytest.TempPathFactory,
    shapes: list[tuple[int, str, tuple[int, ...]]],
    count: int,
    keyed: bool,
    protocol: int,
) -> None:
    """Any appended dicts or tuples of arrays with one fixed first dimension of at most 64 and
    no label column beside deeper arrays read one sample per record, in the record's type."""
    ndims = {1 + len(tail) for _, _, tail in shapes}
    if 1 in ndims and max(ndims) >= 2:  # data beside a label column: chunks, tested apart
        shapes = [(n, dt, tail or (2,)) for n, dt, tail in shapes]
    rng = np.random.default_rng(count)
    objs: list[Any] = []
    for _ in range(count):
        values = [(rng.random((n, *tail)) * 100).astype(dt) for n, dt, tail in shapes]
        objs.append({f"f{k}": v for k, v in enumerate(values)} if keyed else tuple(values))
    root = _appended(tmp_path_factory.mktemp("rec") / "d", objs, protocol)
    _check_both_modes(root, objs)


def test_dict_producers_get_dicts_and_tuple_producers_tuples(tmp_path: Path) -> None:
    rows = [{"x": RNG.random(3), "y": i} for i in range(10)]
    columns = {"x": [RNG.random(3) for _ in range(10)], "y": list(range(10))}
    tuples = ([RNG.random(3) for _ in range(10)], list(range(10)))
    for name, obj, want in (
        ("rows", rows, rows),
        ("columns", columns, [{"x": columns["x"][i], "y": i} for i in range(10)]),
        ("tuples", tuples, [(tuples[0][i], i) for i in range(10)]),
    ):
        root = tmp_path / name
        root.mkdir()
        (root / "f.pkl").write_bytes(pickle.dumps(obj, protocol=5))
        _check_both_modes(root, want)


def test_default_collate_and_transform_see_the_producers_type(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    objs = [{"obs": RNG.random(8).astype(np.float32), "reward": float(i)} for i in range(12)]
    root = _appended(tmp_path / "rl", objs)
    seen: list[type] = []

    def transform(sample: Any) -> Any:
        seen.append(type(sample))
        return sample

    ds, _ = _open(root, transform=transform)
    batch = next(iter(DataLoader(ds, batch_size=4)))
    assert set(batch) == {"obs", "reward"}
    assert torch.equal(batch["obs"], torch.from_numpy(np.stack([o["obs"] for o in objs[:4]])))
    assert batch["reward"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert seen
    assert set(seen) == {dict}


@pytest.mark.parametrize("to", ["memmap", "webdataset"])
def test_a_dict_dataset_converts_to_a_dict_dataset(tmp_path: Path, to: str) -> None:
    from pickleshard import convert, open_dataset, verify

    rows = [{"x": RNG.random(3), "y": i} for i in range(20)]
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.pkl").write_bytes(pickle.dumps(rows, protocol=5))
    out = tmp_path / "out"
    convert(src, out, to=to, jobs=1)
    verify(src, out)
    conv = open_dataset(out, shuffle=False)
    assert json.loads((out / "pickleshard.json").read_text())["sample_form"] == "dict"
    assert all(same(conv[i], rows[i]) for i in (0, 7, 19))
    assert all(same(s, rows[i]) for s, i in zip(conv.__getitems__([3, 1]), [3, 1], strict=True))
    if to == "webdataset":
        assert all(type(s) is dict for s in conv)


def test_an_index_of_the_previous_format_is_rebuilt(tmp_path: Path) -> None:
    objs = [{"obs": RNG.random(8), "next_obs": RNG.random(8)} for _ in range(5)]
    root = _appended(tmp_path / "rl", objs)
    idx = build_index(root, jobs=1)
    header = json.loads((idx.path / "index.json").read_text())
    header["version"] = 4  # what the previous pickleshard wrote: 40 rows of the arrays
    (idx.path / "index.json").write_text(json.dumps(header))
    with pytest.raises(IndexFormatError, match="older pickleshard"):
        PickleDataset(root, jobs=1, rebuild="never")
    ds, _ = _open(root)
    assert ds.index.header["version"] == 5
    assert type(ds[0]) is dict


def test_an_edited_sample_form_is_refused(tmp_path: Path) -> None:
    root = _appended(tmp_path / "rl", [{"a": RNG.random(2)} for _ in range(3)])
    idx = build_index(root, jobs=1)
    header = json.loads((idx.path / "index.json").read_text())
    header["sample_form"] = "tuple"
    (idx.path / "index.json").write_text(json.dumps(header))
    with pytest.raises(IndexFormatError, match="sample_form is 'tuple'"):
        PickleDataset(root, jobs=1, rebuild="never")


# -- files without an extension: CIFAR-10 as downloaded ---------------------------------------


def test_cifar_as_downloaded_is_found_by_its_first_bytes(tmp_path: Path) -> None:
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    for k in (1, 2):
        (root / f"data_batch_{k}").write_bytes(py2_dumps(cifar_batch(20, k)))
    (root / "test_batch").write_bytes(py2_dumps(cifar_batch(20, 9)))
    (root / "batches.meta").write_bytes(pickle.dumps({"label_names": ["a"], "num_vis": 3072}))
    (root / "readme.html").write_text("<meta HTTP-EQUIV='REFRESH' content='0; url=...'>\n")
    (root / "LICENSE").write_text("compute\nthis\nfor me\n")
    os.mkfifo(root / "pipe")  # never opened: a FIFO would block the listing
    found = resolve_source(root)
    assert found.files == ("data_batch_1", "data_batch_2", "test_batch")
    ds, seen = _open(root, encoding="bytes")
    assert not seen
    assert ds.fields == ("labels", "data", "filenames")
    assert len(ds) == 60
    want = pickle.loads((root / "data_batch_2").read_bytes(), encoding="bytes")
    assert same(ds[25], {k.decode(): want[k][5] for k in (b"labels", b"data", b"filenames")})
    assert ds.file_metadata(0) == {"batch_label": b"training batch 1 of 5"}


def test_a_folder_of_files_that_are_not_pickles_still_has_none(tmp_path: Path) -> None:
    (tmp_path / "README").write_text("(not a pickle)\n")
    (tmp_path / "notes.txt").write_bytes(pickle.dumps([1]))  # named as something else
    with pytest.raises(NoPickleFilesError):
        resolve_source(tmp_path)


@settings(max_examples=60, deadline=None)
@given(
    obj=st.recursive(
        st.none() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
        lambda inner: st.lists(inner) | st.tuples(inner, inner) | st.dictionaries(st.text(), inner),
        max_leaves=8,
    ).filter(lambda o: isinstance(o, (list, tuple, dict))),
    protocol=st.integers(0, 5),
)
def test_pickles_of_containers_start_like_pickles(obj: Any, protocol: int) -> None:
    assert starts_like_pickle(pickle.dumps(obj, protocol=protocol)[:4096])


@pytest.mark.parametrize(
    "head",
    [
        b"",
        b"<html><body>CIFAR</body></html>",
        b"compute\nthis\nfor me\n",
        b"\x80\x09garbage",
        b"(this is prose in parentheses)",
        b"]]]",
        b"\x89PNG\r\n\x1a\n",
        b"PK\x03\x04",
    ],
)
def test_other_files_do_not_start_like_pickles(head: bytes) -> None:
    assert not starts_like_pickle(head)
