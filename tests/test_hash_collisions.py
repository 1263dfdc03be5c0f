"""A sample that is a set or dict of 150,000 ints that all hash alike (multiples of 2**61 - 1
on 64-bit CPython: each hashes to 0) takes hours to build, as ``pickle.load`` would; ``pickleshard
index`` and ``inspect`` have no reason to build it and must finish: the index scans it without
building it (sizing reads no sample over 64 KiB), inspect's preview says it builds a set or
dict in too many opcodes instead of evaluating it. A file that *is* such a set or dict (nothing
to read in place, so the index would load it whole) is refused by the walk before the load
(:mod:`pickleshard.picklekit.hashalike`), and flagged by inspect. The pickles are written byte by byte
(building one in Python would hang), and the commands run in a subprocess with a timeout, so a
regression fails instead of hanging."""

from __future__ import annotations

import pickle
import pickletools
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pickleshard import errors
from pickleshard.indexing.build import build_index
from pickleshard.picklekit.hashalike import HASH_ALIKE_MAX, LONG_OPS, AlikeInts, int_argument
from pickleshard.read.whole.load import load_file

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


# -- a whole file that is the colliding container: nothing to read in place, nothing built -------


@pytest.mark.parametrize("kind", ["set", "dict", "set2"])
def test_a_whole_file_of_ints_hashing_alike_is_refused_not_built(tmp_path: Path, kind: str) -> None:
    """The scanner cannot read a set in place and a dict's keys are its fields, so the index
    would load the file whole: the walk before the load refuses it, and inspect flags it."""
    data = tmp_path / "d"
    data.mkdir()
    path = data / "f.pkl"
    path.write_bytes((b"\x80\x02" if kind == "set2" else b"\x80\x04") + _colliding(N, kind) + b".")
    got = _run("index", str(data))
    assert got.returncode != 0
    assert "f.pkl" in got.stderr
    assert "at least 1,025 distinct ints" in got.stderr
    got = _run("inspect", str(path))
    assert got.returncode == 0, got.stderr
    assert "hash alike" in got.stdout
    got = _run("inspect", "--strict", str(path))
    assert got.returncode != 0
    assert "hash alike" in got.stdout + got.stderr


def test_protocol_0_text_ints_are_counted_too(tmp_path: Path) -> None:
    """Protocol 0 writes big ints as ``L...`` text: counted as the binary ones (2,000 keys
    build in milliseconds, over the bound of 1,024)."""
    keys = {k * _P: 0 for k in range(1, 2001)}
    path = tmp_path / "d" / "f.pkl"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps(keys, protocol=0))
    with pytest.raises(errors.SampleLimitError, match="at least 1,025 distinct ints of one pickle"):
        load_file(path, check_first=True)
    assert load_file(path) == keys  # without the walk first, the load builds it (as pickle does)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_big_ints_that_hash_apart_load_as_pickle_loads_them(tmp_path: Path, protocol: int) -> None:
    """No false alarm: 5,000 random 64-bit ids (distinct hashes), one big int 5,000 times,
    and a dict keyed by big ints index and read as ``pickle.load`` gives them."""
    rng = random.Random(protocol)
    ids = [rng.getrandbits(64) | (1 << 63) for _ in range(5000)]
    same = [(1 << 63) + 7] * 5000  # one value written 5,000 times hashes alike with itself only
    data = tmp_path / "d"
    data.mkdir()
    obj = (ids, same, {v: i for i, v in enumerate(ids)}, set(ids))
    (data / "f.pkl").write_bytes(pickle.dumps(obj, protocol=protocol))
    build_index(str(data))
    assert load_file(data / "f.pkl", check_first=True) == obj


def test_the_count_tells_distinct_ints_from_one_repeated() -> None:
    alike = AlikeInts()
    for k in range(1, HASH_ALIKE_MAX + 1):  # at the bound: allowed
        assert alike.add(k * _P, k.to_bytes(4, "little")) == 0
    assert alike.most_alike() == 0
    for _ in range(5 * HASH_ALIKE_MAX):  # one more value, many times: one more distinct int
        alike.add(_P * (HASH_ALIKE_MAX + 1), b"same")
    assert alike.over == HASH_ALIKE_MAX + 1
    assert alike.add(3, b"small") == HASH_ALIKE_MAX + 1  # once over, over
    apart = AlikeInts()
    for k in range(10 * HASH_ALIKE_MAX):  # big ints with distinct hashes never count
        assert apart.add((1 << 62) + k, k.to_bytes(4, "little")) == 0
    assert apart.most_alike() == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=-(2**80), max_value=2**80), min_size=1, max_size=20),
    st.integers(min_value=0, max_value=pickle.HIGHEST_PROTOCOL),
)
def test_int_argument_reads_each_int_as_pickle_does(values: list[int], protocol: int) -> None:
    """Every int opcode the walk counts decodes to the value pickletools (the stdlib's own
    reading) gives it; the oracle is pickle's, not the walk's twin."""
    data = pickle.dumps(values, protocol=protocol)
    ops = list(pickletools.genops(data))
    got = []
    for (op, arg, pos), nxt in zip(ops, [*ops[1:], (None, None, len(data))], strict=True):
        if op.code.encode("latin-1")[0] in LONG_OPS:
            got.append(int_argument(data, pos, nxt[2])[0])
            assert got[-1] == arg
    # protocol 0 writes every int as text; 1 and above those within 32 bits as BININT*
    assert got == [v for v in values if protocol == 0 or not -(2**31) <= v < 2**31]
