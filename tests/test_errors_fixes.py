"""Errors that carry the fix: each refusal a new user met says what the file is and what to do,
in the one hierarchy (pickleshard.errors), the fix where a reader sees it."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from compressors import compress_to
from pickleshard import PickleDataset
from pickleshard.errors import (
    FileChangedError,
    MissingDependencyError,
    NotAPickleError,
    TruncatedPickleError,
    UnsafePickleError,
    UnsupportedLayoutError,
)
from pickleshard.index import SkippedFilesWarning
from pickleshard.inspect.file import inspect_file
from pickleshard.io import open_source
from pickleshard.io.identity import FileIdentity


class Custom:
    """A sample type of the user's own (allowed with trusted=True)."""

    def __init__(self, i: int) -> None:
        self.i = i


def _arrays(n: int) -> tuple[list[np.ndarray], list[int]]:
    return [np.full((3, 16, 16), k, dtype=np.float32) for k in range(n)], list(range(n))


def test_a_file_rewritten_shorter_while_open_is_a_changed_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    path = data / "a.pkl"
    with open(path, "wb") as fh:
        pickle.dump(_arrays(20), fh, protocol=5)
    ds = PickleDataset(data)
    assert ds[0][1] == 0  # the file is open, its reader built
    with open(path, "r+b") as fh:  # the same inode, rewritten shorter
        pickle.dump(_arrays(5), fh, protocol=5)
        fh.truncate()
    for i in (15, 1):  # past the new end (the compiled read meets it first), then inside it
        with pytest.raises(FileChangedError, match=r"it is \d+ bytes, \d+ when indexed") as info:
            ds[i]
        assert not isinstance(info.value, TruncatedPickleError)
        assert str(path) in str(info.value)
        assert f"(sample {i})" in str(info.value)


def test_a_truncated_file_says_skip_bad(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a", "b"):
        with open(data / f"{name}.pkl", "wb") as fh:
            pickle.dump(_arrays(10), fh, protocol=5)
    whole = (data / "b.pkl").read_bytes()
    (data / "b.pkl").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TruncatedPickleError, match=r"b\.pkl") as info:
        PickleDataset(data)
    assert "skip_bad=True" in str(info.value)
    assert "--skip-bad" in str(info.value)
    with pytest.warns(SkippedFilesWarning, match=r"b\.pkl"):  # the fix it names works
        assert len(PickleDataset(data, skip_bad=True)) == 10


def test_a_list_of_custom_objects_points_to_records(write_pickle: object, tmp_path: Path) -> None:
    path = tmp_path / "objs.pkl"
    objs = [Custom(i) for i in range(6)]
    path.write_bytes(pickle.dumps(objs, protocol=5))
    with pytest.raises(UnsupportedLayoutError, match=r"layout='records'") as info:
        PickleDataset([path], trusted=True)
    assert "layout='file'" not in str(info.value)
    ds = PickleDataset([path], trusted=True, layout="records", rebuild="auto")
    assert [ds[i][0].i for i in range(len(ds))] == [o.i for o in pickle.loads(path.read_bytes())]


def test_a_long_refusal_says_what_to_pass_first(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for k in range(3):  # many globals, each a long name: the list runs long
        (data / f"f{k}.pkl").write_bytes(pickle.dumps([Custom(k), os.path.join], protocol=5))
    with pytest.raises(UnsafePickleError) as info:
        PickleDataset(data)
    text = str(info.value)
    assert text.index("What to pass") < text.index(f"{__name__}.Custom (")
    assert text.index("trusted=True") < text.index("The globals (found by reading opcodes")


@pytest.mark.parametrize("legacy", [False, True])
def test_a_torch_save_archive_says_what_it_is(tmp_path: Path, legacy: bool) -> None:
    torch = pytest.importorskip("torch")
    data = tmp_path / "data"
    data.mkdir()
    path = data / "model.pt"
    torch.save({"x": torch.zeros(3, 4)}, path, _use_new_zipfile_serialization=not legacy)
    kind = "legacy format" if legacy else "zip archive"
    with pytest.raises(NotAPickleError) as info:
        PickleDataset([path])
    for said in (f"a torch.save file ({kind})", "torch.load(path, weights_only=True)"):
        assert said in str(info.value)
    assert "persistent id" not in str(info.value)
    with pytest.raises(NotAPickleError, match=r"a torch\.save file"):
        inspect_file(path)


def test_a_changed_mtime_reads_as_a_time() -> None:
    indexed = FileIdentity(10, mtime_ns=1_765_050_000_123_456_789)
    now = FileIdentity(10, mtime_ns=1_765_050_061_000_000_000)
    assert indexed.differs_from(now) == (
        "its mtime is 2025-12-06 19:41:01.000000 UTC, 2025-12-06 19:40:00.123456 UTC when indexed"
    )
    close = FileIdentity(10, mtime_ns=1_765_050_000_123_456_000)
    assert "19:40:00.123456000 UTC, 2025-12-06 19:40:00.123456789 UTC" in str(
        indexed.differs_from(close)
    )


def test_a_missing_decoder_names_the_file_and_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = compress_to(tmp_path / "d.pkl.gz", pickle.dumps(_arrays(3), protocol=5), "gzip")
    monkeypatch.setitem(sys.modules, "rapidgzip", None)  # import fails as if not installed
    with pytest.raises(MissingDependencyError) as info:
        open_source(path).read_at(0, 1)
    assert str(info.value).startswith(f"{path}: ")
    assert "pip install 'pickleshard[compressed]'" in str(info.value)
    assert info.value.path == str(path)
    assert pickle.loads(pickle.dumps(info.value)).path == str(path)


def test_a_missing_fsspec_backend_names_the_url_and_its_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pickleshard.io.remote.source import filesystem

    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'pickleshard\[gcs\]'") as info:
        filesystem("gs://bucket/data/a.pkl")
    assert str(info.value).startswith("gs://bucket/data/a.pkl: ")
