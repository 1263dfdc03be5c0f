"""Memo ids no pickle of its size can hold: refused before CPython's unpickler sizes its memo.

CPython's C unpickler keeps its memo in an array sized to twice the largest PUT id, so one
``LONG_BINPUT`` id near 2**32 in a 20-byte file asks for 64 GiB. A pickle of S bytes defines at
most S memo entries: :func:`check_before_load` refuses any PUT, BINPUT or LONG_BINPUT id above the
file size, naming the file, the opcode's offset, the id and the limit. Whole-file loads run it
with ``check_first=True``; index building always does (span-indexed files only when the
scanner's records cannot rule it out).

Ids here are small enough (<= 10**6) that a regression costs megabytes, not gigabytes; the one
test with an id near 2**32 runs in a child process under an address-space limit.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import BAD_FILES
from pickleshard import errors
from pickleshard.indexing.build import build_index
from pickleshard.picklekit.preload import check_before_load
from pickleshard.read.whole.load import load_file, load_layout, load_records

MID = 1_000_000  # far above every file below, harmless if ever allocated


def _p4(n: int) -> bytes:
    return struct.pack("<I", n)


# ([1], [2]) at protocol 2 with its second list stored at memo id ``mid``, out of order: the
# scanner refuses the file (so index building loads it whole).
def _out_of_order(mid: int) -> bytes:
    return b"\x80\x02]q\x00K\x01a]r" + _p4(mid) + b"K\x02a\x86."


# ([1], [2]) whose memo ids start at ``mid`` and go on in order: the scanner accepts it and the
# span reader would renumber, but a whole-file load would size its memo to ``mid``.
def _in_order(mid: int) -> bytes:
    return b"\x80\x02]r" + _p4(mid) + b"K\x01a]r" + _p4(mid + 1) + b"K\x02a\x86."


def _write(folder: Path, name: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path


# -- the check itself --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "offset", "mid"),
    [
        (_out_of_order(MID), 9, MID),
        (_in_order(MID), 3, MID),
        (b"\x80\x02]r" + _p4(0xFFFFFFF0) + b".", 3, 0xFFFFFFF0),
        (b"\x80\x02]q\xc8.", 3, 200),  # BINPUT 200 in a 6-byte file
        (b"(lp1000000\n.", 2, MID),  # protocol 0 text PUT
        (b"\x80\x04\x95\x0c" + bytes(7) + b"]\x94]r" + _p4(MID) + b"\x86.", 14, MID),  # framed
    ],
    ids=["out_of_order", "in_order", "near_2_32", "binput", "text_put", "framed"],
)
def test_a_memo_id_above_the_file_size_is_refused(data: bytes, offset: int, mid: int) -> None:
    with pytest.raises(errors.CorruptPickleError) as info:
        check_before_load(data, 0, len(data), "f.pkl")
    err = info.value
    assert (err.path, err.offset) == ("f.pkl", offset)
    assert f"memo id {mid}" in str(err)
    assert f"({len(data)} bytes)" in str(err)


def test_payload_bytes_that_look_like_a_long_binput_are_stepped_over() -> None:
    fake = b"r" + _p4(0xFFFFFFF0)  # inside bytes, a string and a protocol 0 string
    for obj in ([fake, fake.decode("latin-1")], {"k": fake * 50}):
        for protocol in range(6):
            data = pickle.dumps(obj, protocol=protocol)
            assert check_before_load(data, 0, len(data), "f.pkl") == len(data)


@pytest.mark.parametrize("protocol", range(6))
def test_valid_pickles_pass_and_the_walk_ends_after_stop(protocol: int) -> None:
    shared = ["s"]
    obj: Any = (
        [np.arange(6, dtype=np.float32) + i for i in range(3)],
        [{"a": i, "b": str(i), "c": shared, "f": 1.5, "n": None} for i in range(400)],
        b"x" * 70_000,  # a payload written outside frames at protocol 4+
        "é" * 300,
    )
    data = pickle.dumps(obj, protocol=protocol)
    tail = pickle.dumps([1, 2], protocol=protocol)
    assert check_before_load(data + tail, 0, len(data + tail), "f.pkl") == len(data)


def test_every_memo_id_up_to_the_file_size_is_allowed() -> None:
    # 400 memoized lists at protocol 2: ids cross from BINPUT to LONG_BINPUT at 256
    data = pickle.dumps([[i] for i in range(400)], protocol=2)
    assert b"r" + _p4(399) in data
    assert check_before_load(data, 0, len(data), "f.pkl") == len(data)
    edge = b"\x80\x02]r" + _p4(9) + b"."  # id == size: allowed
    assert len(edge) == 9
    assert check_before_load(edge, 0, len(edge), "f.pkl") == len(edge)
    with pytest.raises(errors.CorruptPickleError, match="memo id 10 "):
        check_before_load(edge.replace(_p4(9), _p4(10)), 0, len(edge), "f.pkl")


def test_unreadable_opcodes_are_left_to_the_unpickler() -> None:
    for data in (b"\x80\x02]r\x01", b"\x80\x02\xff.", b"\x80\x02T\xff\xff\xff\xff.", b"(lp12"):
        assert check_before_load(data, 0, len(data), "f.pkl") < len(data)


# -- whole-file loading ----------------------------------------------------------------------


def test_whole_file_loads_refuse_with_check_memo(tmp_path: Path) -> None:
    path = _write(tmp_path, "f.pkl", _out_of_order(MID))
    for load in (load_file, load_records, load_layout):
        with pytest.raises(errors.CorruptPickleError, match=rf"memo id {MID} is larger") as info:
            load(path, check_first=True)  # type: ignore[operator]
        assert (info.value.path, info.value.offset) == (os.fspath(path), 9)
    assert load_file(path) == ([1], [2])  # off by default: a small id loads as before


def test_check_memo_walks_every_appended_pickle(tmp_path: Path) -> None:
    first = pickle.dumps(([1], [2]), protocol=2)
    path = _write(tmp_path, "f.pkl", first + _in_order(MID))
    with pytest.raises(errors.CorruptPickleError) as info:
        load_records(path, check_first=True)
    assert info.value.offset == len(first) + 3


@pytest.mark.parametrize(
    ("data", "expected"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_check_memo_keeps_every_other_error(tmp_path: Path, data: bytes, expected: str) -> None:
    path = _write(tmp_path, "bad.pkl", data)
    with pytest.raises(getattr(errors, expected)) as info:
        load_records(path, check_first=True)
    assert info.value.path == os.fspath(path)


def test_check_memo_loads_valid_files_unchanged(tmp_path: Path) -> None:
    for protocol in range(6):
        obj = ([np.full(3, i, np.float32) for i in range(50)], [str(i) for i in range(50)])
        path = _write(tmp_path, f"p{protocol}.pkl", pickle.dumps(obj, protocol=protocol) * 2)
        got = load_records(path, check_first=True)
        assert len(got) == 2
        for rec in got:
            assert rec[1] == obj[1]
            assert all(np.array_equal(a, b) for a, b in zip(rec[0], obj[0], strict=True))


def test_a_memo_id_near_2_32_is_refused_before_any_allocation(tmp_path: Path) -> None:
    """Under a 2 GiB address-space limit, so that a regression fails instead of allocating."""
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from pickleshard.errors import CorruptPickleError\n"
        "from pickleshard.indexing import build_index\n"
        "from pickleshard.read.whole.load import load_records\n"
        "for run in (lambda: load_records(sys.argv[1], check_first=True),\n"
        "            lambda: build_index(sys.argv[2], jobs=1)):\n"
        "    try:\n"
        "        run()\n"
        "    except CorruptPickleError as exc:\n"
        "        if 'memo id 4294967280 is larger' not in str(exc):\n"
        "            sys.exit(f'wrong error: {exc}')\n"
        "    else:\n"
        "        sys.exit('no error')\n"
    )
    path = _write(tmp_path / "data", "f.pkl", _out_of_order(0xFFFFFFF0))
    run = subprocess.run(
        [sys.executable, "-c", code, os.fspath(path), os.fspath(path.parent)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr


# -- index building ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "offset"), [(_out_of_order(MID), 9), (_in_order(MID), 3)], ids=["whole", "span"]
)
def test_index_build_refuses_a_memo_id_above_the_file_size(
    tmp_path: Path, data: bytes, offset: int
) -> None:
    path = _write(tmp_path / "data", "f.pkl", data)
    with pytest.raises(errors.CorruptPickleError, match=rf"memo id {MID} is larger") as info:
        build_index(tmp_path / "data", jobs=1)
    assert (info.value.path, info.value.offset) == (os.fspath(path), offset)


@pytest.mark.parametrize("spans", [True, False])
def test_skip_bad_lists_the_file_and_indexes_the_rest(tmp_path: Path, spans: bool) -> None:
    folder = tmp_path / "data"
    _write(folder, "a.pkl", pickle.dumps(([1, 2], [3, 4]), protocol=2))
    _write(folder, "b.pkl", _in_order(MID))
    index = build_index(folder, jobs=1, skip_bad=True, spans=spans)
    assert [f.path for f in index.files] == ["a.pkl"]
    assert [(s["path"], s["error"]) for s in index.skipped] == [("b.pkl", "CorruptPickleError")]
    assert f"memo id {MID}" in index.skipped[0]["message"]


def test_index_build_of_appended_pickles_walks_only_a_suspect_one(tmp_path: Path) -> None:
    good = pickle.dumps(([1], [2]), protocol=2)
    _write(tmp_path / "ok", "f.pkl", good * 3)
    assert len(build_index(tmp_path / "ok", jobs=1)) == 3
    path = _write(tmp_path / "bad", "f.pkl", good + good + _in_order(MID))
    with pytest.raises(errors.CorruptPickleError) as info:
        build_index(tmp_path / "bad", jobs=1)
    assert info.value.offset == 2 * len(good) + 3
    assert info.value.path == os.fspath(path)
