"""Staleness from ``st_ctime_ns`` and ``st_ino``: what size, mtime and the sampled fingerprint miss.

A same-size rewrite whose mtime is put back with ``os.utime`` still moves the ctime, so the
index sees it even when every changed byte lies outside the fingerprint's 8 sampled blocks. A
copied dataset (new inodes) reads as changed; a moved one stays fresh; an index row without
ctime and inode (edited: version 3 always writes them) is refused, or rebuilt.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from pathlib import Path

import pytest

from conftest import outcome_without_privileges
from pickleshard import errors
from pickleshard.dataset import PickleDataset
from pickleshard.index import fingerprint
from pickleshard.indexing.build import build_index
from pickleshard.indexing.opening import open_index
from pickleshard.io.listing import resolve_source
from pickleshard.pipelines.synth import write_synthetic
from rewrites import big_file, rewrite_keeping_size_and_mtime, unsampled_payload_offset


def test_files_table_records_ctime_and_inode(tmp_path: Path) -> None:
    paths = write_synthetic(tmp_path / "data", files=2, per_file=3, shape=(2,))
    index = build_index(tmp_path / "data", jobs=1)
    header = json.loads((index.path / "index.json").read_text())
    for entry, row, path in zip(index.files, header["files"], paths, strict=True):
        st = path.stat()
        assert (entry.ctime_ns, entry.ino) == (st.st_ctime_ns, st.st_ino)
        assert (row["ctime_ns"], row["ino"]) == (st.st_ctime_ns, st.st_ino)


def test_rewrite_outside_the_sampled_blocks_is_stale_by_its_ctime(tmp_path: Path) -> None:
    path = big_file(tmp_path / "data")
    build_index(tmp_path / "data", jobs=1)
    before = fingerprint(path)
    rewrite_keeping_size_and_mtime(path, unsampled_payload_offset(path))
    assert fingerprint(path) == before  # the old check alone would call this file fresh
    with pytest.raises(errors.StaleIndexError) as info:
        open_index(tmp_path / "data")
    assert info.value.changed == ("big.pkl",)
    assert (info.value.removed, info.value.added) == ((), ())
    assert "big.pkl" in str(info.value)
    with pytest.raises(errors.StaleIndexError, match=r"big\.pkl"):
        PickleDataset(tmp_path / "data")


def test_rebuild_auto_rebuilds_after_an_unsampled_rewrite(tmp_path: Path) -> None:
    path = big_file(tmp_path / "data")
    build_index(tmp_path / "data", jobs=1)
    rewrite_keeping_size_and_mtime(path, unsampled_payload_offset(path))
    index, _ = open_index(tmp_path / "data", rebuild="auto")
    assert index.files[0].ctime_ns == path.stat().st_ctime_ns
    xs, _ = pickle.loads(path.read_bytes())
    ds = PickleDataset(tmp_path / "data", rebuild="never")
    assert [ds[i][0] for i in range(len(ds))] == xs  # the new bytes, from a fresh index


def test_chmod_alone_reads_as_changed(tmp_path: Path) -> None:
    """Only the ctime moves (content, size, mtime, inode all kept): the check is conservative."""
    paths = write_synthetic(tmp_path / "data", files=2, per_file=3, shape=(2,))
    build_index(tmp_path / "data", jobs=1)
    time.sleep(0.02)
    paths[0].chmod(0o600)
    with pytest.raises(errors.StaleIndexError) as info:
        open_index(tmp_path / "data")
    assert info.value.changed == ("part-00000.pkl",)


def test_a_copied_dataset_reads_as_changed_and_rebuilds(tmp_path: Path) -> None:
    """``cp -a`` keeps size, mtime and content but not inodes: nothing cheaper than a rebuild
    proves the copy equal, so every file is named and ``rebuild="auto"`` rebuilds."""
    paths = write_synthetic(tmp_path / "data", files=2, per_file=3, shape=(2,))
    build_index(tmp_path / "data", jobs=1)
    shutil.copytree(tmp_path / "data", tmp_path / "copy")  # copy2: mtimes kept, index too
    for p in paths:
        assert (tmp_path / "copy" / p.name).stat().st_mtime_ns == p.stat().st_mtime_ns
    with pytest.raises(errors.StaleIndexError) as info:
        open_index(tmp_path / "copy")
    assert info.value.changed == ("part-00000.pkl", "part-00001.pkl")
    assert info.value.relinked == info.value.changed  # the message says why: a copy
    assert "a copied dataset" in str(info.value)
    index, _ = open_index(tmp_path / "copy", rebuild="auto")
    assert index.path == tmp_path / "copy" / ".pickleshard"
    assert len(index) == 6
    open_index(tmp_path / "copy", rebuild="never")  # fresh now


def test_a_moved_dataset_stays_fresh(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "data", files=2, per_file=3, shape=(2,))
    built = build_index(tmp_path / "data", jobs=1)
    os.rename(tmp_path / "data", tmp_path / "moved")
    index, _ = open_index(tmp_path / "moved", rebuild="never")
    assert index.header["arrays"] == built.header["arrays"]
    assert len(index) == 6


def test_an_index_without_ctime_and_inode_is_refused_or_rebuilt(tmp_path: Path) -> None:
    """Version 3 always records them (older indexes are rebuilt): a row without them was
    edited, maybe to make an index shipped with a dataset pass for fresh on another machine
    (size, mtime and the fingerprint travel with an archive; inode and ctime do not)."""
    paths = write_synthetic(tmp_path / "data", files=2, per_file=3, shape=(2,))
    index = build_index(tmp_path / "data", jobs=1)
    header_path = index.path / "index.json"
    header = json.loads(header_path.read_text())
    for row in header["files"]:
        del row["ctime_ns"], row["ino"]
    header_path.write_text(json.dumps(header))
    with pytest.raises(errors.IndexFormatError, match=r"index\.json: files\[0\].*ctime_ns"):
        open_index(tmp_path / "data", rebuild="never")
    with pytest.raises(errors.IndexFormatError, match=r"lacks \['ctime_ns', 'ino'\]"):
        open_index(tmp_path / "data")
    opened, _ = open_index(tmp_path / "data", rebuild="auto")
    assert [(f.ctime_ns, f.ino) for f in opened.files] == [
        (p.stat().st_ctime_ns, p.stat().st_ino) for p in paths
    ]


def test_a_skipped_file_rewritten_with_its_old_mtime_is_stale(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    write_synthetic(folder, files=1, per_file=3, shape=(2,))
    bad = folder / "notes.pkl"
    bad.write_bytes(b"plain text, not a pickle\n")
    index = build_index(folder, jobs=1, skip_bad=True)
    (skipped,) = index.skipped
    assert skipped["path"] == "notes.pkl"
    assert (skipped["ctime_ns"], skipped["ino"]) == (bad.stat().st_ctime_ns, bad.stat().st_ino)
    rewrite_keeping_size_and_mtime(bad, 0)
    with pytest.raises(errors.StaleIndexError) as info:
        open_index(folder)
    assert info.value.changed == ("notes.pkl",)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="drops privileges in a forked child")
def test_a_file_that_cannot_be_opened_is_compared_by_its_stat(locked_file: Path) -> None:
    """Unchanged but unreadable: its contents cannot be checked, so the open's error names it;
    unreadable and changed since it was indexed (``chmod`` moves the ctime): changed."""
    index = build_index(locked_file.parent, jobs=1)  # as root, which reads a mode-000 file
    source = resolve_source(locked_file.parent)
    err = outcome_without_privileges(lambda: index.stale_files(source))
    assert isinstance(err, errors.UnreadableFileError)
    assert str(locked_file) in str(err)
    assert "cannot open: Permission denied" in str(err)
    locked_file.chmod(0o600)  # still unreadable to others; its ctime moves

    def stale() -> None:
        assert index.stale_files(source) == (["b.pkl"], [], [])

    assert outcome_without_privileges(stale) is None
