"""The one stepper (``picklekit.extent.extent``) and its compiled twin (``_cscan._extent``, reached
through ``_cscan.extent``): over random opcode streams, every position they step to is one that
``pickletools.genops`` yields; over every truncation of a stream (the stream ending early, or the
buffer holding fewer bytes than the stream), both give the same answer, and never step past the
end; the errors name the file and the opcode's offset."""

from __future__ import annotations

import pickle
import pickletools
import re
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picklegen import values
from pickleshard import _cscan
from pickleshard.errors import CorruptPickleError, TruncatedPickleError
from pickleshard.picklekit import extent as ex

ENGINES: dict[str, Callable[[Any, int, int], int]] = {
    "python": ex.extent,
    "compiled": _cscan.extent,
}
_LEN = {1: "<B", -2: "<B", -3: "<i", -4: "<I", -5: "<Q"}  # pickletools' n -> length prefix
_NAME = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
_TEXT = {  # what genops can decode, per text argument kind
    "decimalnl_short": st.integers(-(10**6), 10**6).map(str),
    "decimalnl_long": st.integers(-(10**30), 10**30).map(lambda i: f"{i}L"),
    "floatnl": st.floats(allow_nan=False, allow_infinity=False).map(repr),
    "stringnl": _NAME.map(repr),
    "stringnl_noescape": _NAME,
    "unicodestringnl": _NAME,
    "stringnl_noescape_pair": st.tuples(_NAME, _NAME).map("\n".join),
}


@st.composite
def _opcode(draw: st.DrawFn) -> bytes:
    """One opcode with an argument genops accepts (payload text is ASCII: it decodes it)."""
    op = draw(st.sampled_from([o for o in pickletools.opcodes if o.name != "STOP"]))
    code = op.code.encode("latin-1")
    if op.arg is None:
        return code
    n, name = op.arg.n, op.arg.name
    if n >= 0:
        return code + draw(st.binary(min_size=n, max_size=n))
    if name in _TEXT:
        return code + draw(_TEXT[name]).encode("ascii") + b"\n"
    payload = draw(st.text("abc xyz", max_size=300).map(str.encode))
    if name in ("long1", "long4"):
        payload = draw(st.binary(max_size=40))
    if n == -2:
        payload = payload[:255]
    return code + struct.pack(_LEN[n], len(payload)) + payload


def _genops_positions(data: bytes) -> list[int]:
    return [pos for _, _, pos in pickletools.genops(data)]


def _steps(step: Callable[[Any, int, int], int], buf: Any, end: int) -> tuple[list[int], int]:
    """Step from 0 while opcodes fit: (positions stepped to, the last answer)."""
    pos, seen = 0, []
    while pos < min(end, len(buf)):
        seen.append(pos)
        nxt = step(buf, pos, end)
        if nxt < 0:
            return seen, nxt
        assert pos < nxt <= end
        pos = nxt
    return seen, pos


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(_opcode(), min_size=1, max_size=30), cut=st.floats(0, 1))
def test_random_opcode_streams_step_where_genops_does(ops: list[bytes], cut: float) -> None:
    data = b"".join(ops) + b"."
    want = _genops_positions(data)
    for step in ENGINES.values():
        assert _steps(step, data, len(data)) == (want, len(data))
    # the stream ends early: the opcodes that fit are stepped over, then one error code
    end = max(1, int(cut * len(data)))
    outcomes = {e: _steps(step, data, end) for e, step in ENGINES.items()}
    assert outcomes["python"] == outcomes["compiled"]
    seen, last = outcomes["python"]
    assert seen == [p for p in want if p < end]
    assert last in (end, ex.CUT, ex.PAST_END)
    # the buffer holds fewer bytes than the stream (a window): SHORT where the head is cut
    window = data[:end]
    outcomes = {e: _steps(step, window, len(data)) for e, step in ENGINES.items()}
    assert outcomes["python"] == outcomes["compiled"]
    seen, last = outcomes["python"]
    assert seen == [p for p in want if p < end]
    assert last >= end or last == ex.SHORT  # a payload need not be in the buffer


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=values(), protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_pickles_step_where_genops_does(value: Any, protocol: int) -> None:
    data = pickle.dumps(value, protocol=protocol)
    want = _genops_positions(data)
    for step in ENGINES.values():
        assert _steps(step, data, len(data)) == (want, len(data))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"T\xfb\xff\xff\xffK\x01.", ex.NEGATIVE),  # BINSTRING's signed length
        (b"T\xff\xff\xff\x7f.", ex.PAST_END),  # the largest positive one, past the end
        (b"\x8e" + b"\xff" * 8 + b".", ex.PAST_END),  # 2**64 - 1: no overflow
        (b"\x8e\x01\x00", ex.CUT),  # the length prefix is cut
        (b"J\x01\x00", ex.CUT),  # a fixed argument is cut
        (b"Ixyz", ex.CUT),  # no newline before the end
        (b"cmod\nname", ex.CUT),  # GLOBAL's second line is cut
        (b"\xff", ex.UNKNOWN),
        (b"\x00", ex.UNKNOWN),
    ],
)
def test_bad_opcodes_give_one_code_in_both_engines(engine: str, data: bytes, code: int) -> None:
    assert ENGINES[engine](data, 0, len(data)) == code


def test_text_lines_are_searched_only_up_to_the_end() -> None:
    data = b"I12\n."
    for step in ENGINES.values():
        assert step(data, 0, 3) == ex.CUT  # the newline at 3 is past an end of 3
        assert step(data, 0, 4) == 4
        assert step(data[:3], 0, 5) == ex.SHORT  # not in the buffer, maybe before the end


@pytest.mark.parametrize(
    ("data", "error", "words"),
    [
        (b"T\xfb\xff\xff\xff.", CorruptPickleError, "BINSTRING declares a negative length -5"),
        (b"B\x10\x00\x00\x00ab", TruncatedPickleError, "16-byte payload of BINBYTES (7 bytes"),
        (b"B\x10\x00", TruncatedPickleError, "stream ends inside the length of BINBYTES"),
        (b"J\x01", TruncatedPickleError, "stream ends inside the argument of BININT"),
        (b"F1.5", TruncatedPickleError, "stream ends inside the text argument of FLOAT"),
        (b"\xff", CorruptPickleError, "unknown opcode 0xff"),
    ],
)
def test_opcode_end_raises_one_error_naming_the_file_and_offset(
    data: bytes, error: type[Exception], words: str
) -> None:
    stream = b"N" + data
    with pytest.raises(error, match=re.escape(words)) as info:
        ex.opcode_end(stream, 1, len(stream), "f.pkl")
    assert isinstance(info.value, CorruptPickleError)
    assert (info.value.path, info.value.offset) == ("f.pkl", 1)
    if error is CorruptPickleError:
        assert not isinstance(info.value, TruncatedPickleError)
