"""The fault corpus (:mod:`corpus.faults`, issue 12): every hostile size, ``BUILD`` on
a global, trailing bytes, special file, tampered index and file rewritten during an epoch ends in
the value ``pickle.load`` gives or a package error naming the file, through every entry point;
never WRONG data, a crash, a hang or a foreign exception. Plus checks that the cases are what
they claim (the payloads really work under a plain ``pickle.load``, the tampers really edit the
index) and that the harness classifies what it sees."""

from __future__ import annotations

import functools
import json
import os
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import pytest

from corpus.corpus import Case
from corpus.corpus_run import fault_counts, fault_table, run_corpus
from corpus.fault_setup import materialise
from corpus.fault_worker import ENTRY_POINTS, NOT_OK
from corpus.faults import TAMPER_KINDS, fault_cases
from pickleshard import build_index

# A first run's wall clock (inspect --strict of the 10**6-deep file takes ~7 s alone); a run past
# it is run again alone with four times that, so a HANG is a run that hangs twice, not one a busy
# machine slowed.
HANG_SECONDS = 30


@functools.cache
def _cases() -> dict[str, Case]:
    """The corpus by name, made once (its 10**6-deep and 2 MB cases take seconds to build)."""
    return {c.name: c for c in fault_cases("/nonexistent/canary")}


@pytest.mark.timeout(900)  # ~40 s on 2 idle cores; the bounds leave room for a busy machine
def test_fault_corpus_never_wrong_crashes_hangs_or_escapes(tmp_path: Path) -> None:
    canary = os.fspath(tmp_path / "canary")
    cases = fault_cases(canary)
    report = run_corpus(
        cases,
        tmp_path,
        canary,
        suite="faults",
        workers=2,
        run_seconds=HANG_SECONDS,
        cpu_seconds=1800,
        wall_seconds=720,  # under the test's timeout; runs it cuts are "not run", a failure
    )
    table = fault_table(report)
    print("\n" + table)
    out = os.environ.get("PICKLESHARD_FAULT_TABLE")
    if out:
        Path(out).write_text(table + "\n")
    assert not os.path.exists(canary)
    assert len(report.outcomes) == len(cases) * len(ENTRY_POINTS), "some runs were not made"
    counts = fault_counts(report)
    assert not any(counts[c] for c in NOT_OK), table


def test_fault_corpus_is_deterministic_and_covers_the_issue(tmp_path: Path) -> None:
    a = fault_cases(os.fspath(tmp_path / "canary"))
    b = fault_cases(os.fspath(tmp_path / "canary"))
    assert [(c.name, c.data, c.extra) for c in a] == [(c.name, c.data, c.extra) for c in b]
    assert {c.family for c in a} == {"sizes", "build", "trailing", "special", "tamper", "rewrite"}
    assert {c.setup for c in a if c.family == "tamper"} == {f"tamper:{k}" for k in TAMPER_KINDS}
    small = [c for c in a if c.family in ("sizes", "build") and c.expect == "refuse"]
    assert all(len(c.data) < 400 for c in small if "deep" not in c.name)


def test_every_payload_is_a_well_formed_pickle() -> None:
    """Each case file (but the lying BYTEARRAY8 and the special files) is a sequence of complete
    pickles: what it tries is the payload, not a syntax error the scanner refuses first."""
    for case in _cases().values():
        if case.family == "special" or case.name == "sizes_bytearray8_huge":
            continue
        if case.name.startswith("sizes_deep"):  # no globals: the C unpickler reads it safely
            deep, depth = pickle.loads(case.data)[0][0], 0
            while deep:
                deep, depth = deep[0], depth + 1
            assert depth == 10**6 - 1, case.name
            continue
        ops = list(pickletools.genops(case.data))
        assert ops[-1][0].name == "STOP", case.name


_TRUSTED_SIZES = """
import pickle, sys
data = open(sys.argv[1], "rb").read()
value = pickle.loads(data)[0][0]
print(len(data), getattr(value, "nbytes", None) or len(value))
"""


@pytest.mark.parametrize("name", ["sizes_bytearray_int", "sizes_numpy_reconstruct_shape"])
def test_size_cases_really_amplify_under_a_plain_load(name: str, tmp_path: Path) -> None:
    """A file of under 200 bytes becomes a 1.5 GB object under a plain ``pickle.loads`` (both
    allocations are zeroed or left untouched by the kernel: cheap to make here)."""
    path = tmp_path / "case.pkl"
    path.write_bytes(_cases()[name].data)
    run = subprocess.run(
        [sys.executable, "-c", _TRUSTED_SIZES, path], capture_output=True, text=True, check=True
    )
    file_size, value_size = map(int, run.stdout.split())
    assert file_size < 200
    assert value_size == 1_500_000_000


_TRUSTED_BUILD = """
import pickle, sys, io
import torch, torch._utils
pickle.loads(open(sys.argv[1], "rb").read())
buf = io.BytesIO()
torch.save(torch.arange(3.0), buf)
print(torch.load(io.BytesIO(buf.getvalue()), weights_only=True).tolist())
"""


@pytest.mark.parametrize("how", ["direct", "memo"])
def test_build_cases_really_rewrite_torch_under_a_plain_load(how: str, tmp_path: Path) -> None:
    """What the issue saw: after a plain ``pickle.loads`` of the case, an unrelated
    ``torch.load(weights_only=True)`` of arange(3) gives negated values."""
    path = tmp_path / "case.pkl"
    path.write_bytes(_cases()[f"build_torch_rebuild_defaults_{how}"].data)
    run = subprocess.run(
        [sys.executable, "-c", _TRUSTED_BUILD, path], capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "[-0.0, -1.0, -2.0]"


def test_nested_torch_payload_runs_the_canary_under_a_plain_load(tmp_path: Path) -> None:
    """The nested payload is live: its inner pickle runs ``posix.system`` when unpickled."""
    canary = tmp_path / "canary"
    case = next(c for c in fault_cases(os.fspath(canary)) if c.name == "build_torch_nested_system")
    inner = [
        a for op, a, _ in pickletools.genops(case.data) if isinstance(a, bytes) and a != b"fine"
    ]
    assert len(inner) == 1
    pickle.loads(inner[0])
    assert canary.exists()


@pytest.mark.parametrize("kind", TAMPER_KINDS)
def test_each_tamper_changes_the_index(tmp_path: Path, kind: str) -> None:
    case = _cases()[f"tamper_{kind}"]
    case_dir = tmp_path / "case"
    case_dir.mkdir()
    (case_dir / "f.pkl").write_bytes(case.data)
    for name, data in case.extra:
        (case_dir / name).write_bytes(data)
    meta = {"setup": "", "suffix": ".pkl", "extra": [n for n, _ in case.extra]}
    clean = materialise(case_dir, meta, tmp_path / "a")
    build_index(clean, jobs=1)
    tampered = materialise(case_dir, {**meta, "setup": case.setup}, tmp_path / "b")
    assert _stored(clean) != _stored(tampered)


def _stored(data: Path) -> tuple[str, list[bytes]]:
    """An index's header and arrays, without what differs between two builds of the same data
    (paths, times, inodes, the arrays' random names)."""
    index = data / ".pickleshard"
    header = json.loads((index / "index.json").read_text())
    arrays = [
        (index / name).read_bytes() if (index / name).is_file() else name.encode()
        for _, name in sorted(header.pop("arrays").items())
    ]
    header.pop("root")
    for f in header["files"]:
        for k in ("mtime_ns", "ctime_ns", "ino"):
            f.pop(k)
    return json.dumps(header, sort_keys=True), arrays


def test_the_harness_tells_right_from_wrong(tmp_path: Path) -> None:
    """The classifier itself: a valid file read through the dataset is ok-correct; the same
    file marked as one to refuse is WRONG (samples returned); trailing zeros are refused by the
    dataset (ok-error, today already)."""
    canary = os.fspath(tmp_path / "canary")
    valid = _cases()["tamper_rows_swapped"]
    cases = [
        Case("valid", "tamper", valid.data),
        Case("valid_but_refuse", "sizes", valid.data, expect="refuse"),
        _cases()["trailing_zeros"],
    ]
    report = run_corpus(
        cases, tmp_path, canary, suite="faults", workers=1, entry_points=["loader:0"]
    )
    assert report.outcomes == {
        "valid::loader:0": {"loader:0": "ok-correct"},
        "valid_but_refuse::loader:0": {"loader:0": "WRONG"},
        "trailing_zeros::loader:0": {"loader:0": "ok-error"},
    }
    assert "not ok: 1" in fault_table(report)


def test_a_run_slowed_past_the_limit_is_run_again_alone(tmp_path: Path) -> None:
    """A first limit no run can meet (1 ms) makes each run a HANG at first; each is run again
    alone, with time to finish, and its second outcome is the one that counts."""
    canary = os.fspath(tmp_path / "canary")
    valid = _cases()["tamper_rows_swapped"]
    report = run_corpus(
        [Case("valid", "tamper", valid.data)],
        tmp_path,
        canary,
        suite="faults",
        workers=1,
        entry_points=["dataset:span", "cli:index"],
        run_seconds=0.001,
        confirm_seconds=120,
    )
    assert report.rerun == ["valid::dataset:span", "valid::cli:index"]
    assert report.outcomes == {
        "valid::dataset:span": {"dataset:span": "ok-correct"},
        "valid::cli:index": {"cli:index": "ok-correct"},
    }
    assert not report.problems
    assert "hung once, then run again alone: 2" in fault_table(report)
