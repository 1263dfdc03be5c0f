"""verify: which mismatches it reports, and how it names them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pickleshard.errors import ConvertedDatasetError, VerifyMismatchError
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.verify.run import verify
from pickleshard.testing import write_files


def _converted(tmp_path: Path, to: str = "memmap") -> tuple[Path, Path]:
    xs = [np.full((2, 2), k, dtype=np.int16) for k in range(6)]
    write_files(tmp_path / "src", [(xs, list(range(6)))])
    convert(tmp_path / "src", tmp_path / "out", to=to)
    return tmp_path / "src", tmp_path / "out"


def test_every_sample_matches(tmp_path: Path) -> None:
    src, out = _converted(tmp_path)
    report = verify(src, out)
    assert (report.checked, report.total, report.against) == (6, 6, "source")
    assert verify(src, out, sample=100).checked == 6


def test_a_different_sample_count_is_reported(tmp_path: Path) -> None:
    _, out = _converted(tmp_path)
    write_files(tmp_path / "other", [([1, 2, 3], [4, 5, 6])])
    with pytest.raises(VerifyMismatchError, match="has 6 samples, the source has 3"):
        verify(tmp_path / "other", out)


def test_the_first_differing_sample_and_field_are_named(tmp_path: Path) -> None:
    _, out = _converted(tmp_path)
    xs = [np.full((2, 2), k, dtype=np.int16) for k in range(6)]
    write_files(tmp_path / "changed", [(xs, [0, 1, 2, 3, 99, 98])])
    with pytest.raises(VerifyMismatchError) as info:
        verify(tmp_path / "changed", out)
    assert info.value.sample == 4
    assert "field 'y' differs: 4, expected 99" in str(info.value)


def test_an_array_mismatch_says_which_elements_differ(tmp_path: Path) -> None:
    _, out = _converted(tmp_path)
    xs = [np.full((2, 2), k, dtype=np.int16) for k in range(6)]
    xs[2][1, 0] = 50
    write_files(tmp_path / "changed", [(xs, list(range(6)))])
    with pytest.raises(VerifyMismatchError) as info:
        verify(tmp_path / "changed", out)
    assert info.value.sample == 2
    assert "1 of 4 elements differ; the first at [1, 0]: np.int16(2), expected np.int16(50)" in (
        str(info.value)
    )


@pytest.mark.parametrize(
    ("got", "want", "said"),
    [
        (np.zeros(3, np.float32), np.zeros(3, ">f4"), "dtype <f4 (float32), expected >f4"),
        (np.zeros((2, 3)), np.zeros((3, 2)), "shape (2, 3), expected (3, 2)"),
        (np.array([0.0, -0.0]), np.array([0.0, 0.0]), "bytes differ (first at element [1]"),
        ({"a": [1, (2, 3)]}, {"a": [1, (2, 4)]}, "['a']: [1]: [1]: 3, expected 4"),
        ([1, 2], (1, 2), "list [1, 2], expected tuple (1, 2)"),
        (np.float32(1), np.float64(1), "float32 np.float32(1.0), expected float64"),
        (np.array(-0.0), np.array(0.0), "bytes differ (first at element []"),
        (np.array([1, 2]), np.array([1, 3]), "the first at [1]: np.int64(2), expected np.int64(3)"),
    ],
)
def test_difference_names_what_differs(got: object, want: object, said: str) -> None:
    from pickleshard.pipelines.verify.difference import difference

    assert said in (difference(got, want) or "")
    assert difference(want, want) is None


def test_a_changed_dtype_is_a_mismatch(tmp_path: Path) -> None:
    _, out = _converted(tmp_path)
    xs = [np.full((2, 2), k, dtype=np.int32) for k in range(6)]
    write_files(tmp_path / "changed", [(xs, list(range(6)))])
    with pytest.raises(VerifyMismatchError, match=r"dtype <i2 \(int16\), expected <i4 \(int32\)"):
        verify(tmp_path / "changed", out)


def test_without_a_source_the_stored_digests_are_used(tmp_path: Path) -> None:
    _, out = _converted(tmp_path)
    assert verify(None, out).against == "stored hashes"
    y = np.load(out / "y.npy", mmap_mode="r+")
    y[3] = 7
    y.flush()
    del y
    with pytest.raises(VerifyMismatchError, match="digest stored at conversion time") as info:
        verify(None, out)
    assert info.value.sample == 3


def test_damaged_stored_digests_are_a_clear_error(tmp_path: Path) -> None:
    _, out = _converted(tmp_path)
    np.save(out / "hashes.npy", np.zeros((2, 16), dtype=np.uint8))
    with pytest.raises(ConvertedDatasetError, match=r"expected uint8 \(6, 16\)"):
        verify(None, out)


def test_an_undecodable_value_is_a_mismatch_naming_the_sample(tmp_path: Path) -> None:
    write_files(tmp_path / "src", [([{"a": k} for k in range(4)], [0, 1, 2, 3])])
    convert(tmp_path / "src", tmp_path / "out")
    values = np.load(tmp_path / "out" / "x.values.npy", mmap_mode="r+")
    offsets = np.load(tmp_path / "out" / "x.offsets.npy")
    values[offsets[2]] = ord("#")  # sample 2's JSON no longer parses
    values.flush()
    del values
    with pytest.raises(VerifyMismatchError, match="cannot read the output") as info:
        verify(tmp_path / "src", tmp_path / "out")
    assert info.value.sample == 2


def test_not_a_conversion(tmp_path: Path) -> None:
    with pytest.raises(ConvertedDatasetError, match="no such directory"):
        verify(None, tmp_path / "nowhere")


def test_a_negative_sample_count_is_refused(tmp_path: Path) -> None:
    src, out = _converted(tmp_path)
    with pytest.raises(ValueError, match="sample must be >= 0"):
        verify(src, out, sample=-1)
