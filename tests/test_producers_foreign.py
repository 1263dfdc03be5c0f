"""Files written by pandas, joblib and dill, read as written: against the producer's own loader
(``pd.read_pickle``, ``joblib.load``, ``dill.load``) as the oracle, and the one up-front audit."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import PickleDataset
from pickleshard.errors import MissingDependencyError, UnsafePickleError
from pickleshard.indexing import describe, openaudit
from pickleshard.producers import joblibfile
from pickleshard.safety.policy import DEFAULT_POLICY
from pickleshard.testing import same

pd = pytest.importorskip("pandas")
joblib = pytest.importorskip("joblib")
dill = pytest.importorskip("dill")


def _rows(ds: PickleDataset) -> list[Any]:
    """Every sample's field values (a dict sample, as a DataFrame's rows are, by field)."""
    return [_values(ds[i]) for i in range(len(ds))]


def _values(sample: Any) -> tuple[Any, ...]:
    return tuple(sample.values()) if isinstance(sample, dict) else sample


def _frame() -> Any:
    return pd.DataFrame(
        {
            "f": np.arange(7, dtype=np.float32) / 2,
            "i": np.arange(7) * 3,
            "s": list("abcdefg"),
            "t": pd.date_range("2024-01-01", periods=7),
            "c": pd.Categorical(list("xxyyzzx")),
        }
    )


def _frame_rows(obj: Any) -> list[tuple[Any, ...]]:
    frame = obj.to_frame() if isinstance(obj, pd.Series) else obj
    cols = [frame.iloc[:, j].to_numpy() for j in range(frame.shape[1])]
    return [tuple(c[i] for c in cols) for i in range(len(frame))]


# ---------------------------------------------------------------- pandas


def test_dataframe_reads_one_sample_per_row_under_the_preset(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    _frame().to_pickle(tmp_path / "d" / "a.pkl")
    _frame().iloc[::-1].to_pickle(tmp_path / "d" / "b.pkl")
    ds = PickleDataset(tmp_path / "d", allow="pandas", jobs=1)
    assert ds.fields == ("f", "i", "s", "t", "c")
    want = _frame_rows(pd.read_pickle(tmp_path / "d" / "a.pkl"))
    want += _frame_rows(pd.read_pickle(tmp_path / "d" / "b.pkl"))
    got = _rows(ds)
    assert len(got) == len(want) == 14
    assert all(same(g, w) for g, w in zip(got, want, strict=True))


def test_series_is_one_field(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    pd.Series(np.linspace(0, 1, 5), name="v").to_pickle(tmp_path / "d" / "s.pickle")
    ds = PickleDataset(tmp_path / "d", allow=["pandas"], jobs=1)
    assert ds.fields == ("v",)
    want = _frame_rows(pd.read_pickle(tmp_path / "d" / "s.pickle"))
    assert all(same(g, w) for g, w in zip(_rows(ds), want, strict=True))


def test_pandas_without_the_preset_is_one_error_at_open_naming_every_global(
    tmp_path: Path,
) -> None:
    (tmp_path / "d").mkdir()
    _frame().to_pickle(tmp_path / "d" / "a.pkl")
    _frame().to_pickle(tmp_path / "d" / "b.pkl")
    pd.Series([1.0, 2.0]).to_pickle(tmp_path / "d" / "c.pkl")
    with pytest.raises(UnsafePickleError) as info:
        PickleDataset(tmp_path / "d", jobs=1)
    text = str(info.value)
    assert "3 of 3 file(s) need globals the allowlist refuses" in text
    assert "pandas.DataFrame (not allowed) in 2 files" in text
    assert "pandas.Series (not allowed) in 1 file" in text
    assert "pandas.core.internals.managers.BlockManager (not allowed) in 2 files" in text
    assert "allow='pandas'" in text
    assert "allow_globals=" not in text  # no hint at an argument that cannot work
    assert not (tmp_path / "d" / ".pickleshard" / "index.json").exists()  # before any build


def test_refusal_at_read_time_points_at_the_preset(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    _frame().to_pickle(tmp_path / "d" / "a.pkl")
    with pytest.raises(UnsafePickleError, match=r"allow='pandas' \(CLI: --allow pandas\)"):
        PickleDataset(tmp_path / "d", jobs=1, audit=False)


# ---------------------------------------------------------------- joblib


def _xy() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((37, 3, 4)).astype(np.float32), np.arange(37, dtype=np.int64)


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(_xy(), id="tuple"),
        pytest.param(list(_xy()), id="list"),
        pytest.param({"X": _xy()[0], "y": _xy()[1]}, id="dict"),
        pytest.param(_xy()[0], id="array"),
        pytest.param((_xy()[0].astype(">f8"), _xy()[1].astype(">i4")), id="big-endian"),
    ],
)
def test_joblib_arrays_are_read_by_rows_in_place(tmp_path: Path, obj: Any) -> None:
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "dump.joblib"  # no pickle extension: named through a glob
    joblib.dump(obj, path)
    ds = PickleDataset(str(tmp_path / "d" / "*.joblib"), jobs=1)
    assert ds.file_modes == ("span",)
    want = joblib.load(path)
    cols = list(want.values()) if isinstance(want, dict) else want
    cols = [cols] if isinstance(cols, np.ndarray) else cols
    assert ds.fields == (tuple(want) if isinstance(want, dict) else ("x", "y")[: len(cols)])
    for i in range(len(ds)):
        assert all(same(g, c[i]) for g, c in zip(_values(ds[i]), cols, strict=True))
    whole = PickleDataset(str(tmp_path / "d" / "*.joblib"), jobs=1, mode="whole")
    assert all(same(a, b) for a, b in zip(_rows(whole), _rows(ds), strict=True))


@pytest.mark.parametrize(
    ("compress", "mode"),
    # zlib (joblib's default compressor) is loaded whole through joblib; gzip, bz2 and xz are
    # decompressed by the byte-source layer (pickleshard.io.compressed.source), under which the
    # uncompressed joblib stream is read in place
    [(3, "whole"), (("gzip", 3), "span"), (("bz2", 1), "span"), (("xz", 1), "span")],
)
def test_compressed_joblib_is_detected_and_read(tmp_path: Path, compress: Any, mode: str) -> None:
    (tmp_path / "d").mkdir()
    X, y = _xy()
    joblib.dump((X, y), tmp_path / "d" / "xy.pkl", compress=compress)
    ds = PickleDataset(tmp_path / "d", jobs=1)
    assert ds.file_modes == (mode,)
    X2, y2 = joblib.load(tmp_path / "d" / "xy.pkl")
    assert all(same(ds[i], (X2[i], y2[i])) for i in range(len(ds)))


def test_joblib_detection_is_by_bytes() -> None:
    head = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00"
    assert joblibfile.sniff_joblib(head + b"joblib.numpy_pickle NumpyArrayWrapper") == "joblib"
    assert joblibfile.sniff_joblib(pickle.dumps(([1], [2]))) == ""
    assert joblibfile.sniff_joblib(b"\x1f\x8b\x08\x00garbage") == ""


def test_compressed_joblib_without_joblib_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "xy.pkl"
    joblib.dump(_xy(), path, compress=3)
    monkeypatch.setitem(sys.modules, "joblib", None)
    with pytest.raises(MissingDependencyError, match=r"joblib.dump file; loading it needs"):
        joblibfile.load_joblib(path, DEFAULT_POLICY)


def test_joblib_object_arrays_are_read_whole(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    objs = np.array([{"a": 1}, None, "x"], dtype=object)
    joblib.dump((objs, np.arange(3)), tmp_path / "d" / "o.pkl")
    ds = PickleDataset(tmp_path / "d", jobs=1)
    assert ds.file_modes == ("whole",)
    want = joblib.load(tmp_path / "d" / "o.pkl")
    assert [ds[i][0] for i in range(3)] == list(want[0])


# ---------------------------------------------------------------- dill and the audit


def test_dill_arrays_need_the_dill_preset_named_up_front(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    obj = ([np.arange(4.0) * k for k in range(5)], list(range(5)))
    with open(tmp_path / "d" / "a.pkl", "wb") as fh:
        dill.dump(obj, fh)
    with pytest.raises(UnsafePickleError) as info:
        PickleDataset(tmp_path / "d", jobs=1)
    assert "dill._dill._create_array (not allowed) in 1 file" in str(info.value)
    assert "allow='dill'" in str(info.value)
    ds = PickleDataset(tmp_path / "d", allow="dill", jobs=1, rebuild="auto")
    with open(tmp_path / "d" / "a.pkl", "rb") as fh:
        want = dill.load(fh)
    assert all(same(ds[i], (want[0][i], want[1][i])) for i in range(5))


class Unlisted:
    def __init__(self, v: int) -> None:
        self.v = v


def test_audit_lists_every_refused_global_with_file_counts(tmp_path: Path) -> None:
    from collections import Counter
    from fractions import Fraction

    (tmp_path / "d").mkdir()
    for k in range(3):
        with open(tmp_path / "d" / f"f{k}.pkl", "wb") as fh:
            extra = [Counter("ab")] if k else [Fraction(1, 3)]
            pickle.dump(([1, 2], [extra, Unlisted(k)]), fh)
    with pytest.raises(UnsafePickleError) as info:
        PickleDataset(tmp_path / "d", jobs=1)
    text = str(info.value)
    assert "3 of 3 file(s)" in text
    assert "collections.Counter (not allowed) in 2 files" in text
    assert "fractions.Fraction (not allowed) in 1 file" in text
    assert f"{__name__}.Unlisted (not allowed) in 3 files" in text
    assert "--allow-global collections.Counter" in text
    assert info.value.path.endswith("f0.pkl")
    assert info.value.offset is not None


def test_audit_is_kept_per_file_and_redone_only_for_changed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit's results are kept with the index: reopening walks nothing; a rebuild audits
    in the same pass as its scan (the scan's own walk lists the globals), and the dataset's
    audit then walks no file again."""
    (tmp_path / "d").mkdir()
    for k in range(2):
        with open(tmp_path / "d" / f"f{k}.pkl", "wb") as fh:
            pickle.dump(([np.zeros(2)] * 3, [0, 1, 2]), fh)
    PickleDataset(tmp_path / "d", jobs=1)
    assert (tmp_path / "d" / ".pickleshard" / openaudit.CACHE_NAME).exists()
    opened: list[str] = []
    built: list[str] = []
    real, real_buffer = openaudit.file_globals, describe.buffer_globals

    def counting(path: Any, policy: Any, options: Any = None) -> Any:
        opened.append(str(path))
        return real(path, policy, options)

    def counting_buffer(buf: Any, size: int, where: str) -> Any:
        built.append(where)
        return real_buffer(buf, size, where)

    monkeypatch.setattr(openaudit, "file_globals", counting)
    monkeypatch.setattr(describe, "buffer_globals", counting_buffer)
    PickleDataset(tmp_path / "d", jobs=1)
    assert (opened, built) == ([], [])
    with open(tmp_path / "d" / "f1.pkl", "wb") as fh:
        pickle.dump(([np.ones(2)] * 3, [0, 1, Unlisted(1)]), fh)
    with pytest.raises(UnsafePickleError, match="Unlisted"):
        PickleDataset(tmp_path / "d", jobs=1, rebuild="auto")
    # the rebuild's scan listed f1's globals from its own walk (safety.audit.named): neither the
    # dataset's audit nor describe's buffer walk went over any file again, and Unlisted was
    # refused from those facts
    assert (opened, built) == ([], [])


def test_trusted_skips_the_audit(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with open(tmp_path / "d" / "a.pkl", "wb") as fh:
        pickle.dump(([1, 2], [Unlisted(1), Unlisted(2)]), fh)
    ds = PickleDataset(tmp_path / "d", trusted=True, jobs=1)
    assert ds[1][1].v == 2


def test_unknown_preset_names_the_presets(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown allow preset 'panda'; the presets are pandas"):
        PickleDataset(tmp_path, allow="panda")


def test_audit_walks_a_joblib_files_pickle_part(tmp_path: Path) -> None:
    from collections import Counter

    (tmp_path / "d").mkdir()
    joblib.dump({"X": _xy()[0], "c": Counter("ab"), "u": Unlisted(1)}, tmp_path / "d" / "j.pkl")
    with pytest.raises(UnsafePickleError) as info:
        PickleDataset(tmp_path / "d", jobs=1)
    text = str(info.value)
    assert "collections.Counter (not allowed) in 1 file" in text
    assert f"{__name__}.Unlisted (not allowed) in 1 file" in text
    assert "NumpyArrayWrapper" not in text  # the readers handle the wrapper themselves


@pytest.mark.parametrize("compress", [0, 3])
def test_inspect_says_a_joblib_file_is_one(tmp_path: Path, compress: int) -> None:
    from pickleshard.errors import CorruptPickleError
    from pickleshard.inspect.file import inspect_file

    joblib.dump(_xy(), tmp_path / "xy.pkl", compress=compress)
    with pytest.raises(CorruptPickleError, match=r"a joblib.dump file \(joblib"):
        inspect_file(tmp_path / "xy.pkl")


def test_a_damaged_audit_cache_is_walked_again(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with open(tmp_path / "d" / "a.pkl", "wb") as fh:
        pickle.dump(([1, 2], [Unlisted(1), 2]), fh)
    cache = tmp_path / "d" / ".pickleshard" / openaudit.CACHE_NAME
    cache.parent.mkdir()
    cache.write_text('{"version": 2, "files": {"a.pkl": [1, 2, 3, [["x"]]]}}')
    with pytest.raises(UnsafePickleError, match="Unlisted"):
        PickleDataset(tmp_path / "d", jobs=1)
