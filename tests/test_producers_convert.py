"""Objects that load but no format stores as they are: PIL images and scipy sparse matrices
convert in their array form; anything else names the field and suggests ``transform=``."""

from __future__ import annotations

import pickle
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import PickleDataset, convert
from pickleshard.errors import UnencodableValueError
from pickleshard.formats import open_dataset
from pickleshard.testing.formats import WritesUnpicklable

Image = pytest.importorskip("PIL.Image")
sparse = pytest.importorskip("scipy.sparse")


def _write(folder: Path, obj: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "a.pkl", "wb") as fh:
        pickle.dump(obj, fh)
    return folder / "a.pkl"


def _read_back(out: Path) -> list[Any]:
    ds = open_dataset(out, shuffle=False)
    return [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("to", ["webdataset", "lmdb"])
def test_pil_images_convert_to_uint8_arrays(tmp_path: Path, to: str) -> None:
    pixels = [np.full((4, 5, 3), k * 40, np.uint8) for k in range(3)]
    images = [Image.fromarray(p) for p in pixels]
    images.append(Image.fromarray(np.arange(20, dtype=np.uint8).reshape(4, 5), mode="L"))
    path = _write(tmp_path / "d", (images, [0, 1, 2, 3]))
    with open(path, "rb") as fh:
        want = pickle.load(fh)
    ds = PickleDataset(tmp_path / "d", allow="pil", jobs=1)
    assert isinstance(ds[0][0], Image.Image)  # reading gives the images as loaded
    convert(ds, tmp_path / "out", to=to, jobs=1, verify=True)
    got = _read_back(tmp_path / "out")
    for (x, y), img, label in zip(got, want[0], want[1], strict=True):
        assert x.dtype == np.uint8
        assert np.array_equal(x, np.asarray(img))
        assert y == label


def test_sparse_matrices_convert_to_csr_triplets(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    mats = [sparse.random(4, 6, density=0.4, format=f, random_state=rng) for f in ("csr", "coo")]
    _write(tmp_path / "d", (mats, [5, 6]))
    convert(tmp_path / "d", tmp_path / "out", to="lmdb", jobs=1, allow="scipy.sparse", verify=True)
    for (x, y), m, label in zip(_read_back(tmp_path / "out"), mats, [5, 6], strict=True):
        data, indices, indptr, shape = x
        rebuilt = sparse.csr_matrix((data, indices, indptr), shape=shape)
        assert shape == m.shape
        assert (rebuilt != m.tocsr()).nnz == 0
        assert y == label


def test_other_objects_name_the_field_and_suggest_transform(tmp_path: Path) -> None:
    # an object pickle cannot write again is refused, naming the field and the way out
    _write(tmp_path / "bad", ([1, 2], [WritesUnpicklable(), WritesUnpicklable()]))
    with pytest.raises(UnencodableValueError) as info:
        convert(tmp_path / "bad", tmp_path / "out", to="lmdb", jobs=1, trusted=True)
    text = str(info.value)
    assert "field 'y'" in text
    assert "Unpicklable" in text
    assert "transform=" in text
    # any other object is stored as a pickle; a transform still turns it into plain values
    _write(tmp_path / "d", ([1, 2], [Fraction(1, 3), Fraction(2, 3)]))
    kwargs: dict[str, Any] = {"to": "lmdb", "jobs": 1, "allow_globals": ["fractions.Fraction"]}
    convert(tmp_path / "d", tmp_path / "out2", transform=_as_pair, verify=True, **kwargs)
    assert _read_back(tmp_path / "out2") == [(1, [1, 3]), (2, [2, 3])]


def _as_pair(sample: tuple[Any, ...]) -> tuple[Any, ...]:
    x, y = sample
    return (x, [y.numerator, y.denominator])
