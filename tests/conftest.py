"""Shared fixtures: writing pickle files, the ``pickle.load`` oracle, deep equality, bad files."""

from __future__ import annotations

import io
import os
import pickle
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

WritePickle = Callable[..., Path]


@pytest.fixture
def write_pickle(tmp_path: Path) -> WritePickle:
    """``write_pickle(name, obj, protocol=5, folder="data")``: dump ``obj`` under ``tmp_path``."""

    def write(name: str, obj: Any, protocol: int = 5, folder: str = "data") -> Path:
        path = tmp_path / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            pickle.dump(obj, fh, protocol=protocol)
        return path

    return write


def oracle_samples(path: Path) -> list[Any]:
    """Samples of ``path`` as the user means them, derived from ``pickle.load`` alone, in the
    producer's type: dicts (keyed by the first row's keys) for a dict of columns or a list of
    dicts, tuples otherwise."""
    with open(path, "rb") as fh:
        obj = pickle.load(fh)
    if isinstance(obj, dict):
        keys = list(obj)
        return [{k: obj[k][i] for k in keys} for i in range(len(obj[keys[0]]))]
    if isinstance(obj, list) and obj and isinstance(obj[0], tuple):
        return [tuple(row) for row in obj]
    if isinstance(obj, list) and obj and isinstance(obj[0], dict):
        keys = list(obj[0])
        return [{k: row[k] for k in keys} for row in obj]
    columns = list(obj)
    return [tuple(c[i] for c in columns) for i in range(len(columns[0]))]


def _truncations(data: bytes) -> list[int]:
    n = len(data)
    return sorted({1, 2, 5, n // 3, n // 2, n - 2, n - 1})


def _valid_pickle_bytes(protocol: int) -> bytes:
    xs = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(40)]
    return pickle.dumps((xs, list(range(40))), protocol=protocol)


def _zip_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("a.txt", "hello " * 50)
    return buf.getvalue()


def _bad_file_cases() -> Iterator[tuple[str, bytes, str]]:
    yield "empty", b"", "EmptyPickleError"
    yield "text", b"hello world\nthis is a text file, not a pickle\n", "NotAPickleError"
    yield "csv", b"x,y\n1.5,2\n3.5,4\n", "NotAPickleError"
    yield "zip", _zip_bytes(), "NotAPickleError"
    noise = np.random.default_rng(1234).integers(0, 256, size=512, dtype=np.uint8).tobytes()
    yield "noise", b"\xfe" + noise, "NotAPickleError"
    yield "unknown_protocol", b"\x80\x09" + noise, "NotAPickleError"
    for protocol in (2, 3, 4, 5):
        data = _valid_pickle_bytes(protocol)
        for cut in _truncations(data):
            yield f"truncated_p{protocol}_at{cut}", data[:cut], "TruncatedPickleError"
    for protocol in (0, 1):
        data = pickle.dumps(([1.5, 2.5, 3.5], [1, 2, 3]), protocol=protocol)
        for cut in (1, len(data) // 2, len(data) - 1):
            yield f"truncated_p{protocol}_at{cut}", data[:cut], "TruncatedPickleError"


# (case id, file bytes, expected error class name): shared by the whole-file, index and dataset
# tests so that every entry point is held to the same bad inputs.
BAD_FILES = list(_bad_file_cases())

LAYOUT_CASES: dict[str, tuple[Any, str]] = {
    "int": (5, "UnsupportedLayoutError"),
    "dict_of_ints": ({"a": 1, "b": 2}, "UnsupportedLayoutError"),
    "string": ("not samples", "UnsupportedLayoutError"),
    "empty_list": ([], "UnsupportedLayoutError"),
    "rows_with_different_keys": ([{"x": 1, "y": 2}, {"x": 3}], "UnsupportedLayoutError"),
}


@pytest.fixture
def unreadable_dir_pkl(tmp_path: Path) -> Path:
    """A directory named like a pickle file: ``open`` fails with IsADirectoryError, even as root."""
    path = tmp_path / "data" / "dir.pkl"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def dangling_link(tmp_path: Path) -> Path:
    """A symlink named ``broken.pkl`` inside ``tmp_path/links`` whose target does not exist."""
    folder = tmp_path / "links"
    folder.mkdir()
    link = folder / "broken.pkl"
    os.symlink(tmp_path / "nowhere" / "gone.pkl", link)
    return link


@pytest.fixture
def locked_file() -> Iterator[Path]:
    """``b.pkl`` with mode 000 beside a readable ``a.pkl``, in a directory anyone may enter."""
    folder = Path(tempfile.mkdtemp(prefix="pickleshard-locked-"))
    try:
        folder.chmod(0o755)
        for name in ("a.pkl", "b.pkl"):
            with open(folder / name, "wb") as fh:
                pickle.dump(([1, 2], [3, 4]), fh)
            (folder / name).chmod(0o644)
        (folder / "b.pkl").chmod(0)
        yield folder / "b.pkl"
    finally:
        shutil.rmtree(folder)


def outcome_without_privileges(fn: Callable[[], object]) -> BaseException | None:
    """Run ``fn`` as an unprivileged user and return the exception it raised (None if none).

    Tests run as root in CI, and root reads any file whatever its mode: as root, ``fn`` runs in a
    forked child that first drops to uid/gid 65534 ("nobody"); the exception comes back pickled.
    """
    if os.geteuid() != 0:
        try:
            fn()
        except BaseException as exc:
            return exc
        return None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                fn()
                result: BaseException | None = None
            except BaseException as exc:
                result = exc
            os.write(write_end, pickle.dumps(result))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    assert data, "the unprivileged child reported nothing"
    result = pickle.loads(data)
    assert result is None or isinstance(result, BaseException)
    return result
