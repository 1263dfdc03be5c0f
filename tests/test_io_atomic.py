"""``pickleshard.io.atomic``: a destination appears whole or not at all, and no temporary file
outlives a failed write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pickleshard.io.atomic import (
    TMP_MARK,
    AtomicWrite,
    atomic_file,
    atomic_path,
    write_bytes_atomic,
)


class Boom(Exception):
    pass


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _file_then(dest: Path, exc: BaseException) -> None:
    with atomic_file(dest) as fh:
        fh.write(b"half")
        raise exc


def _path_then(dest: Path, exc: BaseException) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(b"half")
        raise exc


def _file(dest: Path) -> None:
    with atomic_file(dest) as fh:
        fh.write(b"data")


def test_write_bytes_atomic_writes_the_destination_and_nothing_else(tmp_path: Path) -> None:
    dest = tmp_path / "out.bin"
    write_bytes_atomic(dest, b"hello")
    assert dest.read_bytes() == b"hello"
    assert _names(tmp_path) == ["out.bin"]


def test_an_existing_destination_is_replaced_whole(tmp_path: Path) -> None:
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"x" * 1000)
    inode = dest.stat().st_ino
    with atomic_file(dest) as fh:
        fh.write(b"short")
        assert dest.read_bytes() == b"x" * 1000  # untouched until the block ends
    assert dest.read_bytes() == b"short"  # not b"short" + the old tail
    assert dest.stat().st_ino != inode  # a new file renamed over it, not a rewrite in place
    assert _names(tmp_path) == ["out.bin"]


@pytest.mark.parametrize("fsync", [False, True])
def test_the_temporary_file_sits_next_to_the_destination(tmp_path: Path, fsync: bool) -> None:
    dest = tmp_path / "out.bin"
    with atomic_file(dest, fsync=fsync) as fh:
        during = _names(tmp_path)
        fh.write(b"data")
    assert len(during) == 1
    assert during[0].startswith(f"out.bin{TMP_MARK}{os.getpid()}-")
    assert dest.read_bytes() == b"data"


def test_a_failure_leaves_no_temporary_file_and_no_partial_destination(tmp_path: Path) -> None:
    dest = tmp_path / "out.bin"
    with pytest.raises(Boom):
        _file_then(dest, Boom())
    assert _names(tmp_path) == []
    dest.write_bytes(b"old")
    with pytest.raises(Boom):
        _path_then(dest, Boom())
    assert dest.read_bytes() == b"old"  # the previous content stays, whole
    assert _names(tmp_path) == ["out.bin"]


def test_an_interrupt_is_handled_like_any_failure(tmp_path: Path) -> None:
    dest = tmp_path / "out.bin"
    with pytest.raises(KeyboardInterrupt):
        _file_then(dest, KeyboardInterrupt())
    assert _names(tmp_path) == []


def test_a_failed_rename_removes_the_temporary_file(tmp_path: Path) -> None:
    dest = tmp_path / "taken"
    (dest / "inside").mkdir(parents=True)  # a non-empty folder: os.replace cannot replace it
    with pytest.raises(IsADirectoryError):
        _file(dest)
    assert _names(tmp_path) == ["taken"]
    assert _names(dest) == ["inside"]


def test_atomic_write_commits_or_aborts_across_calls(tmp_path: Path) -> None:
    kept, dropped = AtomicWrite(tmp_path / "kept"), AtomicWrite(tmp_path / "dropped")
    assert kept.tmp != AtomicWrite(tmp_path / "kept").tmp  # two writers never share one
    for write in (kept, dropped):
        with open(write.tmp, "wb") as fh:
            fh.write(b"body")
    kept.commit()
    dropped.abort()
    dropped.abort()  # nothing left to remove: not an error
    assert _names(tmp_path) == ["kept"]
    assert (tmp_path / "kept").read_bytes() == b"body"
