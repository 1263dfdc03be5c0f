"""CIFAR-style dicts: batch files as published (no extension, protocol 2, ``bytes`` keys, a
per-file ``batch_label`` beside the columns, ``data`` uint8 ``(N, 3072)``), Python 2 and 3
writers; each opens with one argument, matches ``pickle.load``, names fields by the keys' text,
keeps the label as file metadata and reads the 2-D array by rows in place."""

from __future__ import annotations

import pickle
import tarfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from layouts_cifar import cifar_batch, py2_dumps
from pickleshard import PickleDataset
from pickleshard.cli import main
from pickleshard.errors import UnsupportedLayoutError
from pickleshard.inspect.file import inspect_file
from pickleshard.scan import scan_bytes
from pickleshard.scan.records import decode_records
from pickleshard.testing import same

N = 40


def _write(root: Path, *, py2: bool, hundred: bool = False) -> list[Path]:
    """CIFAR's file names (no extension): five training batches, one test batch."""
    root.mkdir()
    names = ["data_batch_1", "data_batch_2", "test_batch"] if not hundred else ["train", "test"]
    paths = []
    for seed, name in enumerate(names, start=1):
        batch = cifar_batch(N, seed, hundred=hundred)
        path = root / name
        path.write_bytes(py2_dumps(batch) if py2 else pickle.dumps(batch, protocol=2))
        paths.append(path)
    return sorted(paths)  # the dataset's file order


def _oracle(paths: list[Path], encoding: str) -> list[dict[str, Any]]:
    """Every sample by ``pickle.load`` alone: a dict of the batch's values but the label, row
    by row, keyed by the keys' text (the producer wrote a dict)."""
    out = []
    for p in paths:
        with open(p, "rb") as f:
            d = pickle.load(f, encoding=encoding)
        cols = {
            k.decode() if isinstance(k, bytes) else k: v
            for k, v in d.items()
            if isinstance(v, (list, np.ndarray))
        }
        out += [{k: v[i] for k, v in cols.items()} for i in range(N)]
    return out


@pytest.mark.parametrize("encoding", ["bytes", "latin1"])
@pytest.mark.parametrize("hundred", [False, True])
def test_python2_batches_open_as_published(tmp_path: Path, encoding: str, hundred: bool) -> None:
    paths = _write(tmp_path / "cifar", py2=True, hundred=hundred)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ambiguity: 40 rows of lists beside the array
        ds = PickleDataset(str(tmp_path / "cifar" / "*"), encoding=encoding, jobs=1)
    labels = ("fine_labels", "coarse_labels") if hundred else ("labels",)
    assert ds.fields == (*labels, "data", "filenames")
    assert ds.file_modes == ("span",) * len(paths)  # the data rows are read in place
    for f in ds.index.files:
        assert f.scan is not None
        assert f.scan["kinds"][len(labels)] == "array_row"
    want = _oracle(paths, encoding)
    assert len(ds) == len(want)
    for i in (0, 1, N - 1, N, len(want) - 1):
        assert same(ds[i], want[i]), i
    batch = ds.__getitems__([len(want) - 1, 3, N + 2])
    assert same(batch[1]["data"], want[3]["data"])
    assert same(batch[0], want[-1])
    with open(paths[0], "rb") as f:
        label = pickle.load(f, encoding=encoding)[
            "batch_label" if encoding == "latin1" else b"batch_label"
        ]
    assert ds.file_metadata(0) == {"batch_label": label}
    assert ds.file_metadata(paths[1]) == {"batch_label": ds.file_metadata(1)["batch_label"]}


def test_python3_protocol2_batches_open_and_match(tmp_path: Path) -> None:
    """Python 3 at protocol 2 writes bytes as latin-1 text: the file reads whole, and says why."""
    paths = _write(tmp_path / "cifar", py2=False)
    ds = PickleDataset([str(p) for p in paths], jobs=1)
    assert ds.fields == ("labels", "data", "filenames")
    assert ds.file_modes == ("whole",) * 3
    assert "latin-1 text" in (ds.index.files[0].reason or "")
    want = _oracle(paths, "ASCII")
    assert same(ds[N + 5], want[N + 5])
    assert ds.file_metadata(2) == {"batch_label": b"training batch 3 of 5"}
    report = inspect_file(paths[2])  # read inertly whole: the label is still metadata
    assert report.fields == ds.fields
    assert report.metadata == {"batch_label": "b'training batch 3 of 5'"}


def test_inspect_names_the_metadata_and_the_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _write(tmp_path / "cifar", py2=True)
    report = inspect_file(paths[0], encoding="bytes")
    assert report.span_indexable
    assert report.fields == ("labels", "data", "filenames")
    assert report.metadata == {"batch_label": "b'training batch 1 of 5'"}
    assert report.ambiguity is None
    assert main(["inspect", "--encoding", "bytes", str(paths[0])]) == 0
    out = capsys.readouterr().out
    assert "metadata batch_label = b'training batch 1 of 5'" in out
    assert "(labels, data, filenames)" in out


def test_python2_array_reasons_never_guess_object_dtype() -> None:
    """A Python 2 uint8 array: rows in place with a byte-preserving encoding; a short one
    (``SHORT_BINSTRING``) reads whole, and the reason says what it is."""
    big = py2_dumps({b"x": np.arange(600, dtype=np.uint8).reshape(200, 3), b"y": list(range(200))})
    assert scan_bytes(big, encoding="latin1").kinds == ("array_row", "pickle")
    small = py2_dumps({b"x": np.zeros((4, 8), np.uint8), b"y": [1, 2, 3, 4]})
    with pytest.raises(Exception, match="short Python 2 str") as info:
        scan_bytes(small, encoding="bytes")
    assert "object dtype" not in str(info.value)


def test_webdataset_members_are_named_by_the_keys_text(tmp_path: Path) -> None:
    paths = _write(tmp_path / "cifar", py2=True)
    out = tmp_path / "wds"
    assert (
        main(
            [
                "convert",
                str(tmp_path / "cifar" / "*"),
                str(out),
                "--to",
                "webdataset",
                "--encoding",
                "bytes",
                "--jobs",
                "1",
            ]
        )
        == 0
    )
    names = []
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            names += tar.getnames()
    assert any(n.endswith(".labels.cls") for n in names)
    assert not any("b'" in n or "b_" in n for n in names)
    assert len([n for n in names if n.endswith(".npy")]) == len(paths) * N  # the data rows


def test_metadata_only_beside_columns_in_a_file_of_one_pickle() -> None:
    """Appended dicts with a scalar stay one sample per pickle; in a file of one pickle, scalars
    are metadata only beside two or more columns of one length, and otherwise stay in the one
    sample (never silently dropped); a value that is neither a column nor a small scalar is
    named; two keys naming one field are refused."""
    objs = [{"obs": np.zeros(3), "reward": 1.0}, {"obs": np.ones(3), "reward": 0.5}]
    assert decode_records(objs, "f.pkl").layout == "appended_dict_samples"
    assert scan_bytes(b"".join(pickle.dumps(o) for o in objs)).layout == "appended_dict_samples"
    columns = {"x": [1, 2], "y": [5, 6], "note": "hello", "n": 3}
    one = decode_records([columns], "f.pkl")
    assert one.fields == ("x", "y")
    assert one.metadata == {"note": "hello", "n": 3}
    assert scan_bytes(pickle.dumps(columns)).metadata == {"note": "hello", "n": 3}
    lone = {"x": [1, 2], "note": "hello", "n": 3}  # one column: the scalars stay in the sample
    for got in (decode_records([lone], "f.pkl"), scan_bytes(pickle.dumps(lone))):
        assert (got.layout, got.fields, got.metadata) == ("dict_samples", ("x", "note", "n"), {})
    with pytest.raises(UnsupportedLayoutError, match="for key 'bad' is set"):
        decode_records([{"x": [1, 2], "y": [3, 4], "bad": {1, 2}}], "f.pkl")
    with pytest.raises(UnsupportedLayoutError, match="name the same field twice"):
        decode_records([{"x": [1, 2], b"x": [3, 4]}], "f.pkl")


def test_split_refuses_to_drop_a_files_metadata(tmp_path: Path) -> None:
    from pickleshard import split

    py2 = tmp_path / "py2"
    py2.write_bytes(py2_dumps(cifar_batch(N, 1)))
    py3 = tmp_path / "py3"  # read whole: protocol 2 arrays are text
    py3.write_bytes(pickle.dumps(cifar_batch(N, 2), protocol=2))
    for path, enc in ((py2, "bytes"), (py3, "ASCII")):
        with pytest.raises(
            UnsupportedLayoutError, match=r"metadata \['batch_label'\] would be lost"
        ):
            split(path, tmp_path / f"out-{path.name}", max_samples=10, encoding=enc)
