"""A sample that is a set or dict of 150,000 ints that all hash alike (multiples of 2**61 - 1
on 64-bit CPython: each hashes to 0) takes hours to build, as ``pickle.load`` would; ``pickleshard
index`` and ``inspect`` have no reason to build it and must finish: the index scans it without
building it (sizing reads no sample over 64 KiB), inspect's preview says it builds a set or
dict in too many opcodes instead of evaluating it. The pickles are written byte by byte
(building one in Python would hang), and the commands run in a subprocess with a timeout, so a
regression fails instead of hanging."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

N = 150_000
_P = (1 << 61) - 1  # sys.hash_info.modulus: k * _P hashes to 0 for every k
_TIMEOUT = 120  # seconds; each command takes well under one, building the sample hours


def _long1(v: int) -> bytes:
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _colliding(n: int, kind: str) -> bytes:
    """Opcodes of a set (protocol 4 EMPTY_SET/ADDITEMS), a dict (EMPTY_DICT/SETITEMS, values
    0) or a protocol 2 ``set([...])`` (REDUCE on builtins.set) of ``n`` ints hashing to 0."""
    ints = [_long1(k * _P) for k in range(1, n + 1)]
    if kind == "set2":
        return b"cbuiltins\nset\n](" + b"".join(ints) + b"e\x85R"
    out = [b"\x8f" if kind == "set" else b"}"]
    for lo in range(0, n, 1000):
        batch = ints[lo : lo + 1000]
        if kind == "dict":
            batch = [k + b"K\x00" for k in batch]
        out.append(b"(" + b"".join(batch) + (b"\x90" if kind == "set" else b"u"))
    return b"".join(out)


def _columns(n: int, kind: str) -> bytes:
    """``([<colliding>, 0], [0, 1])``: sample 0's x is the colliding container."""
    proto = b"\x80\x02" if kind == "set2" else b"\x80\x04"
    return proto + b"](" + _colliding(n, kind) + b"K\x00e](K\x00K\x01e\x86."


def _records(n: int, kind: str) -> bytes:
    """``[(<colliding>, 0), (1, 1)]``."""
    return b"\x80\x04](" + _colliding(n, kind) + b"K\x00\x86K\x01K\x01\x86e."


@pytest.mark.parametrize("kind", ["set", "dict", "set2"])
def test_the_pickles_are_what_they_claim(kind: str) -> None:
    x, y = pickle.loads(_columns(50, kind))  # small: quick to build
    assert len(x[0]) == 50
    assert {hash(v) for v in x[0]} == {0}
    assert (x[1], y) == (0, [0, 1])
    assert pickle.loads(_records(50, kind))[1] == (1, 1)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "pickleshard", *args],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"pickleshard {' '.join(args)} ran past {_TIMEOUT} s: it built the sample")


@pytest.mark.parametrize(
    ("kind", "make"), [("set", _columns), ("dict", _columns), ("set2", _columns), ("set", _records)]
)
def test_index_and_inspect_never_build_the_sample(tmp_path: Path, kind: str, make: object) -> None:
    data = tmp_path / "d"
    data.mkdir()
    path = data / "f.pkl"
    path.write_bytes(make(N, kind))  # type: ignore[operator]
    got = _run("index", str(data))
    assert got.returncode == 0, got.stderr
    assert "2 samples" in got.stdout
    assert "1 read by span" in got.stdout
    for flags in ([], ["--strict"]):
        got = _run("inspect", *flags, str(path))
        assert "not evaluated" in got.stdout, (got.stdout, got.stderr)
        assert "int 1" in got.stdout  # the other samples are previewed as usual
