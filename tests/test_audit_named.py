"""The audit's facts from the scan's walk (:mod:`pickleshard.safety.audit.named`) against the
audit's own walk (:func:`pickleshard.indexing.openaudit.buffer_globals`, the reference): on the
bad-input and fault corpora and on generated pickles, wherever the facts answer they name
exactly the globals (and first offsets) the audit's walk names; the compiled walk and its Python
twin keep the same facts; and for what picklers write (numpy arrays, classes, every protocol)
the facts do answer, so the index build walks no file twice."""

from __future__ import annotations

import collections
import datetime
import fractions
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from corpus.corpus import generate
from corpus.faults import fault_cases
from picklegen import build, datasets, dumps
from pickleshard import build_index
from pickleshard.errors import PickleshardError
from pickleshard.indexing.openaudit import CACHE_NAME, buffer_globals
from pickleshard.picklekit.walk import resolve_engine, walk_opcodes
from pickleshard.safety.audit.named import named_globals
from pickleshard.scan import scan_file

ENGINES = ["python"] + (["compiled"] if resolve_engine("auto") == "compiled" else [])


def _facts(data: bytes, engine: str) -> tuple[Any, dict[Any, int] | None] | None:
    """(the walk's facts, what they name), or None when the walk refuses the bytes."""
    try:
        w = walk_opcodes(data, len(data), "f.pkl", engine=engine)
    except (PickleshardError, RecursionError):
        return None
    return (list(w.named), dict(w.strs)), named_globals(data, w)


def _reference(data: bytes) -> dict[Any, int] | None:
    try:
        return buffer_globals(data, len(data), "f.pkl")
    except PickleshardError:
        return None


def _check(data: bytes) -> str:
    """Compare both walkers' facts and the audit's walk on ``data``; say which case it was."""
    got = [_facts(data, e) for e in ENGINES]
    assert all(g == got[0] for g in got), "the compiled walk keeps other facts than its twin"
    if got[0] is None:
        return "not walked"
    named = got[0][1]
    if named is None:
        return "audit walks"
    want = _reference(data)
    if want is None:  # the audit's walk refuses what the scan read: more refused, never less
        return "audit refuses"
    assert named == want
    return "same"


def test_the_corpora_name_what_the_audit_names(tmp_path: Path) -> None:
    canary = str(tmp_path / "canary")
    seen: collections.Counter[str] = collections.Counter()
    for case in [*generate(canary), *fault_cases(canary)]:
        seen[_check(case.data)] += 1
    assert seen["same"] > 300, seen  # the facts answer for most files the scan reads
    assert not (tmp_path / "canary").exists()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=datasets())
def test_generated_pickles_name_what_the_audit_names(spec: dict[str, Any]) -> None:
    objs = build(spec["layout"], spec["columns"], spec["names"])
    data = b"".join(dumps(o, spec["protocol"], numpy1=spec["numpy1"]) for o in objs)
    _check(data)


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("numpy1", [False, True])
def test_what_picklers_write_is_answered_from_the_walk(protocol: int, numpy1: bool) -> None:
    xs = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(40)]
    odd = [Point(1), datetime.date(2024, 1, 2), fractions.Fraction(1, 3), {1, 2}, b"\x00" * 300]
    data = dumps((xs + odd, list(range(45))), protocol, numpy1=numpy1)
    w = walk_opcodes(data, len(data), "f.pkl")
    named = named_globals(data, w)
    assert named is not None
    assert named == buffer_globals(data, len(data), "f.pkl")
    assert ("test_audit_named", "Point") in named or (__name__, "Point") in named


def test_a_stack_global_of_computed_operands_is_left_to_the_audit() -> None:
    # STACK_GLOBAL whose module is the result of a call: the facts do not say; the audit's walk
    # names it "?.?" (and so does the read's refusal)
    data = b"\x80\x04\x8c\x08builtins\x8c\x03str\x93\x8c\x02os\x85R\x8c\x06system\x93."
    w = walk_opcodes(data, len(data), "f.pkl", engine="python")
    assert named_globals(data, w) is None


def test_the_index_build_keeps_the_walks_globals(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    xs = [np.full(3, i, np.float32) for i in range(20)]
    (folder / "a.pkl").write_bytes(pickle.dumps((xs, list(range(20))), protocol=5))
    scan = scan_file(folder / "a.pkl")
    assert scan.named_globals
    build_index(folder, index=tmp_path / "i")
    cache = (tmp_path / "i" / CACHE_NAME).read_text()
    for module, name in scan.named_globals:
        assert f'"{module}", "{name}"' in cache


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("rows", [False, True])
def test_a_scan_answers_from_its_own_walk_in_every_protocol(
    tmp_path: Path, protocol: int, rows: bool
) -> None:
    # through scan_file, as an index build scans (the match lets go of the walk's GETs: the
    # facts must be read before; numpy's second global is a GET of a stored 'numpy' from
    # protocol 4 on), both the columns layout and rows of (array, label)
    xs = [np.full((2, 3), i, np.float32) for i in range(30)]
    obj = list(zip(xs, range(30), strict=True)) if rows else (xs, list(range(30)))
    path = tmp_path / "a.pkl"
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    data = path.read_bytes()
    scan = scan_file(path)
    assert scan.named_globals is not None
    assert scan.named_globals == buffer_globals(data, len(data), "a.pkl")
