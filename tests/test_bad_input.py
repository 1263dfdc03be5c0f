"""The bad-input corpus (:mod:`corpus.corpus`): every damaged, hostile or foreign
file ends in a PickleshardError naming it, or in the value ``pickle.load`` gives, through every
entry point, in bounded time and memory, without running code; plus regression tests for what
the corpus found, and the index fingerprint against same-size, same-mtime rewrites."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from corpus.corpus import Case, generate, opcode_offsets, valid_files
from corpus.corpus_run import run_corpus
from corpus.diff import deep_diff
from pickleshard import build_index, open_index
from pickleshard.errors import CorruptPickleError, PickleshardError, StaleIndexError
from pickleshard.read import SpanReader
from pickleshard.read.whole.load import load_records
from pickleshard.scan import scan_bytes, scan_file
from rewrites import big_file, rewrite_keeping_size_and_mtime, sampled_blocks


def test_corpus_never_crashes_hangs_or_executes(tmp_path: Path) -> None:
    canary = os.fspath(tmp_path / "canary")
    cases = generate(canary)
    report = run_corpus(cases, tmp_path, canary, workers=2, wall_seconds=270)
    summary = report.summary()
    print("\n" + summary)
    (tmp_path / "summary.txt").write_text(summary)
    out = os.environ.get("PICKLESHARD_CORPUS_SUMMARY")
    if out:
        Path(out).write_text(summary + "\n\n" + "\n".join(report.problems) + "\n")
    assert not os.path.exists(canary)
    assert len(report.outcomes) == len(cases), "some cases were not run"
    assert not report.problems, "\n".join(report.problems[:40])


def test_corpus_is_deterministic_and_covers_every_family(tmp_path: Path) -> None:
    a = generate(os.fspath(tmp_path / "canary"))
    b = generate(os.fspath(tmp_path / "canary"))
    assert [c.name for c in a] == [c.name for c in b]
    assert [c.data for c in a] == [c.data for c in b]
    families = {c.family for c in a}
    assert families == {
        "valid",
        "truncated",
        "bitflip",
        "reencoded",
        "length",
        "frames",
        "deep",
        "stack",
        "hostile",
        "foreign",
    }
    assert len(a) > 2000


def test_every_valid_file_is_truncated_at_every_opcode() -> None:
    cases = generate("/nonexistent/canary")
    cuts = {c.name for c in cases if c.family == "truncated"}
    for label, data in valid_files():
        offsets = [k for k in opcode_offsets(data) if k]
        assert len(offsets) > 10
        assert all(f"trunc_{label}_at{k}" in cuts for k in offsets)


def test_hostile_cases_run_code_when_trusted(tmp_path: Path) -> None:
    """The hostile cases really are hostile: a plain ``pickle.loads`` creates the canary."""
    canary = tmp_path / "canary"
    case = next(c for c in generate(os.fspath(canary)) if c.name == "hostile_os_system_p2_top")
    pickle.loads(case.data)
    assert canary.exists()


def test_deep_diff_handles_deep_nesting_and_nan() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    other: list[Any] = []
    for _ in range(100_000):
        other = [other]
    assert deep_diff(deep, other) is None
    assert deep_diff([float("nan")], [float("nan")]) is None
    assert deep_diff([1], [1.0]) is not None
    assert deep_diff(np.zeros(2, "f4"), np.zeros(2, "f8")) is not None


# -- regressions found by the corpus ----------------------------------------------------------


def _corrupt_after_scan(tmp_path: Path, obj: Any, old: bytes, new: bytes) -> SpanReader:
    path = tmp_path / "f.pkl"
    data = pickle.dumps(obj, 4)
    path.write_bytes(data)
    reader = SpanReader(scan_file(path))
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, new))
    return reader


def test_span_read_of_bad_utf8_is_a_corrupt_pickle_error(tmp_path: Path) -> None:
    reader = _corrupt_after_scan(tmp_path, (["héllo", "b"], [1, 2]), "é".encode(), b"\xff\xfe")
    with pytest.raises(CorruptPickleError, match="UnicodeDecodeError") as info:
        reader.read_sample(0)
    assert reader.path in str(info.value)
    assert info.value.offset is not None


def test_span_read_of_bad_numpy_state_is_a_corrupt_pickle_error(tmp_path: Path) -> None:
    # a dtype code flipped after the scan: numpy raises TypeError from inside the unpickler
    arrays = [np.arange(3, dtype=np.float32) + i for i in range(2)]
    reader = _corrupt_after_scan(tmp_path, (arrays, [1, 2]), b"\x8c\x02f4", b"\x8c\x02g4")
    with pytest.raises(CorruptPickleError, match="TypeError") as info:
        reader.read_sample(0)
    assert reader.path in str(info.value)


def test_scan_of_a_dict_key_that_is_not_utf8_names_file_and_offset() -> None:
    data = pickle.dumps({"xé": [1, 2], "y": [3, 4]}, 4).replace("xé".encode(), b"x\xff\xfe")
    with pytest.raises(CorruptPickleError, match="not UTF-8") as info:
        scan_bytes(data, "keys.pkl")
    assert "keys.pkl" in str(info.value)
    assert info.value.offset is not None


# -- the index fingerprint: same size, same mtime, different bytes -----------------------------


def test_rewrite_inside_a_sampled_block_makes_the_index_stale(tmp_path: Path) -> None:
    path = big_file(tmp_path / "data")
    build_index(tmp_path / "data", jobs=1)
    _, hi = sampled_blocks(path.stat().st_size)[3]
    rewrite_keeping_size_and_mtime(path, hi - 10)
    with pytest.raises(StaleIndexError, match=r"big\.pkl"):
        open_index(tmp_path / "data")


def test_every_corpus_case_name_is_a_valid_file_name() -> None:
    for case in generate("/nonexistent/canary"):
        assert isinstance(case, Case)
        assert "/" not in case.name
        assert case.suffix in (".pkl", ".pickle")


def test_package_errors_name_the_file_for_a_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / "noise.pkl"
    path.parent.mkdir()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    with pytest.raises(PickleshardError, match=r"noise\.pkl"):
        build_index(tmp_path / "data", jobs=1)


def test_whole_file_memory_error_names_file_and_offset(tmp_path: Path) -> None:
    # (a LONG_BINPUT near 2**32 also ends in MemoryError, but only under the corpus' RLIMIT_AS:
    # without a limit CPython may really allocate and zero a 32 GiB memo)
    path = tmp_path / "f.pkl"
    huge = b"\x80\x05\x8e" + (2**62).to_bytes(8, "little") + b"abc."  # BINBYTES8 of 2**62 bytes
    path.write_bytes(b"\x80\x04K\x01." + huge)  # the second pickle of the file
    with pytest.raises(CorruptPickleError) as info:
        load_records(path)
    assert os.fspath(path) in str(info.value)
    assert info.value.offset == 5


def test_a_case_that_kills_its_worker_is_named_and_the_rest_still_run(tmp_path: Path) -> None:
    """The runner itself: a worker killed by its CPU limit (SIGXCPU) on a 3M-deep case is
    reported as that case's failure, and a fresh worker goes on with the cases after it."""
    canary = os.fspath(tmp_path / "canary")
    n = 3_000_000  # the corpus' memoized_deep, 30 times deeper: far more than one CPU second
    slow = Case("deep_slow", "deep", b"\x80\x04" + b"]\x94" * n + b"a" * (n - 1) + b".")
    valid = next(c for c in generate(canary) if c.name == "valid_rows_p4")
    report = run_corpus([slow, valid], tmp_path, canary, workers=1, cpu_seconds=1)
    assert report.outcomes["deep_slow"]["worker"].startswith("died")
    assert len(report.problems) == 1
    assert report.problems[0].startswith("deep_slow: the worker died")
    assert report.outcomes["valid_rows_p4"]["dataset"] == "ok"


def test_general_span_reader_counts_memoize_after_an_explicit_put(tmp_path: Path) -> None:
    """A valid pickle mixing BINPUT and MEMOIZE (the corpus' re-encoded family): C's unpickler
    stores MEMOIZE at len(memo), so 'q' lands at id 2 and GET 1 is 'p'. The general path used to
    overwrite id 1 and return 'q' without any error."""
    data = (
        b"\x80\x04]q\x00("  # x = [ MARK
        b"\x8c\x01pq\x01"  # 'p' BINPUT 1
        b"\x8c\x01q\x94"  # 'q' MEMOIZE (id 2)
        b"h\x01\x87q\x03"  # BINGET 1, TUPLE3, BINPUT 3
        b"K\x07e]q\x04(K\x01K\x02e\x86q\x05."  # 7 APPENDS; y = [1, 2]; TUPLE2
    )
    path = tmp_path / "mixed.pkl"
    path.write_bytes(data)
    want = pickle.loads(data)
    assert want[0][0] == ("p", "q", "p")
    scan = scan_file(path)
    for general in (False, True):
        with SpanReader(scan, general=general) as reader:
            assert reader.read_sample(0) == (want[0][0], 1)
            assert reader.read_sample(1) == (7, 2)


def test_a_one_bit_flip_can_make_whole_file_loading_allocate_a_huge_memo(tmp_path: Path) -> None:
    """Documents a limit of ``load_file`` without ``check_first``: CPython's C unpickler sizes
    its memo array to the largest PUT id, so a LONG_BINPUT id near 2**31 in a 9-byte file asks
    for ~32 GiB. Under an address-space limit that is a clean CorruptPickleError; without one
    it is real memory. ``check_first=True`` and index building refuse the id first
    (tests/test_memo_ids.py); the span path renumbers memo ids and is not affected."""
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from pickleshard.errors import CorruptPickleError\n"
        "from pickleshard.read.whole.load import load_file\n"
        "try:\n"
        "    load_file(sys.argv[1])\n"
        "except CorruptPickleError as exc:\n"
        "    sys.exit(0 if 'memory' in str(exc) else 2)\n"
        "sys.exit(3)\n"
    )
    path = tmp_path / "memo.pkl"
    path.write_bytes(b"\x80\x02]r\xff\xff\xff\x7f.")
    run = subprocess.run([sys.executable, "-c", code, os.fspath(path)], check=False)
    assert run.returncode == 0
