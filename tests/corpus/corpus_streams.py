"""The corpus's hand-built opcode streams: lying lengths, re-framed and re-encoded valid files,
deep nesting and broken stacks (the ``length``, ``frames``, ``reencoded``, ``deep`` and
``stack`` families of :mod:`corpus.corpus`). Each generator yields
``(name, bytes)``; nothing here unpickles anything.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import random
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["DEEP", "columns", "deep", "frames", "lengths", "reencode", "stack"]

DEEP = 100_000
HUGE = 2**62
_P8 = struct.Struct("<Q").pack
_P4 = struct.Struct("<I").pack
_I4 = struct.Struct("<i").pack


def columns(n: int = 2) -> dict[str, list[Any]]:
    """Small columns of every kind of value the valid files hold: arrays, ints, odd scalars,
    objects that share one list."""
    rng = np.random.default_rng(7)
    shared = ["shared", 1]
    return {
        "x": [rng.standard_normal(3).astype(np.float32) for _ in range(n)],
        "y": [i % 3 for i in range(n)],
        "tag": (["a", "é", "a", 2**70, None, b"\x00b", 1.5, True] * n)[:n],
        "obj": ([shared, (shared, bytearray(b"ba")), {"k": -(2**33)}] * n)[:n],
    }


def lengths() -> Iterator[tuple[str, bytes]]:
    p5, p2 = b"\x80\x05", b"\x80\x02"
    tail = b"abc" * 5 + b"."
    for op, name in ((b"\x8e", "BINBYTES8"), (b"\x8d", "BINUNICODE8"), (b"\x96", "BYTEARRAY8")):
        for n in (HUGE, 2**64 - 1, 2**63, 16):
            yield f"{name}_{n}", p5 + op + _P8(n) + tail
    for op, name in ((b"B", "BINBYTES"), (b"X", "BINUNICODE"), (b"T", "BINSTRING")):
        for n in (2**32 - 1, 2**31 - 1, 16):
            yield f"{name}_{n}", p2 + op + _P4(n) + tail
    for n in (-1, -(2**31), -16):
        yield f"BINSTRING_neg{-n}", p2 + b"T" + _I4(n) + tail
        yield f"LONG4_neg{-n}", p2 + b"\x8b" + _I4(n) + tail
    yield "LONG4_huge", p2 + b"\x8b" + _P4(2**31 - 1) + tail
    yield "LONG1_255", p2 + b"\x8a\xff" + tail
    yield "SHORT_BINBYTES_255", p5 + b"C\xff" + tail
    yield "SHORT_BINUNICODE_255", p5 + b"\x8c\xff" + tail
    yield "SHORT_BINSTRING_255", p2 + b"U\xff" + tail
    for mid in (2**31 - 1, 2**32 - 1, 2**32 - 2):
        yield f"LONG_BINPUT_{mid}", p2 + b"]r" + _P4(mid) + b"."
        yield f"LONG_BINPUT_GET_{mid}", p2 + b"]r" + _P4(mid) + b"j" + _P4(mid) + b"\x86."
        yield f"LONG_BINGET_{mid}", p2 + b"]j" + _P4(mid) + b"a."
    yield "PUT_text_huge", b"(lp99999999999999999999\n."
    yield "GET_text_huge", b"(lg99999999999999999999\na."
    yield "PUT_text_nan", b"(lpabc\n."
    body = b"]\x94(K\x01K\x02e."
    for n in (HUGE, len(body) + 1, 2**64 - 1, 0, 1):
        yield f"FRAME_{n}", b"\x80\x04\x95" + _P8(n) + body
    yield "FRAME_cut_header", b"\x80\x04\x95\x10\x00"
    # a valid (x, y) file whose first bytes payload claims 2**62 bytes
    good = pickle.dumps(([b"payload-1", b"payload-2"], [1, 2]), 5)
    at = good.index(b"payload-1") - 1
    yield (
        "layout_SHORT_BINBYTES_to_BINBYTES8",
        good[: at - 1] + b"\x8e" + _P8(HUGE) + good[at + 1 :],
    )
    arr = pickle.dumps(([np.zeros(4, np.float32)], [1]), 5)
    at = arr.index(b"\x96")
    yield "layout_BYTEARRAY8_huge", arr[: at + 1] + _P8(HUGE) + arr[at + 9 :]
    yield "layout_BYTEARRAY8_short", arr[: at + 1] + _P8(15) + arr[at + 9 :]
    yield "layout_BYTEARRAY8_long", arr[: at + 1] + _P8(17) + arr[at + 9 :]


def _unframed_ops(data: bytes) -> list[bytes]:
    """The opcodes of one protocol 4+ pickle without its PROTO and FRAME opcodes."""
    ops = list(pickletools.genops(data))
    ends = [p for _, _, p in ops[1:]] + [len(data)]
    return [
        data[p:e]
        for (op, _, p), e in zip(ops, ends, strict=True)
        if op.name not in ("FRAME", "PROTO") and p is not None
    ]


def _framed(head: bytes, chunks: list[bytes]) -> bytes:
    return head + b"".join(b"\x95" + _P8(len(c)) + c for c in chunks)


def frames() -> Iterator[tuple[str, bytes]]:
    """Valid layouts re-framed: frames that cut opcodes, one opcode per frame, empty frames,
    frames inside frames, frame lengths one off."""
    objs = {
        "columns": ([b"ab" * 40, "xyz", 1.5, None], [1, 2, 3, 4]),
        "dict": {"x": ["k" * 300, [1, 2]], "y": [0, 1]},
    }
    for label, obj in objs.items():
        for protocol in (4, 5):
            head = bytes((0x80, protocol))
            ops = _unframed_ops(pickle.dumps(obj, protocol))
            body = b"".join(ops)
            name = f"{label}_p{protocol}"
            for size in (1, 2, 3, 7, 64):
                chunks = [body[k : k + size] for k in range(0, len(body), size)]
                yield f"{name}_cut{size}", _framed(head, chunks)
            yield f"{name}_per_opcode", _framed(head, ops)
            yield f"{name}_empty_between", _framed(head, [c for op in ops for c in (op, b"")])
            yield f"{name}_unframed", head + body
            outer = _framed(b"", [body[:10]])
            yield f"{name}_nested", _framed(head, [outer + body[10:]])
            for delta in (-1, 1):
                yield f"{name}_len{delta:+d}", head + b"\x95" + _P8(len(body) + delta) + body
            half = len(ops) // 2
            two = [b"".join(ops[:half]), b"".join(ops[half:])]
            yield (
                f"{name}_two_frames_short",
                head
                + b"\x95"
                + _P8(len(two[0]) - 1)
                + two[0]
                + (b"\x95" + _P8(len(two[1]) + 1) + two[1]),
            )
            yield f"{name}_many_empty", head + (b"\x95" + _P8(0)) * 20_000 + body


_Q = struct.Struct("<q").pack


def _reencode_op(name: str, arg: Any, raw: bytes, memo_id: int, rng: random.Random) -> bytes:
    """Another encoding of one opcode that unpickles to the same value, or ``raw``."""
    pick = rng.randrange(3)
    if name == "SHORT_BINUNICODE":
        text = arg.encode("utf-8", "surrogatepass")
        return (raw, b"X" + _P4(len(text)) + text, b"\x8d" + _P8(len(text)) + text)[pick]
    if name == "SHORT_BINBYTES":
        payload = bytes(arg)
        return (raw, b"B" + _P4(len(payload)) + payload, b"\x8e" + _P8(len(payload)) + payload)[
            pick
        ]
    if name in ("BININT1", "BININT2"):
        return (raw, b"J" + _I4(arg), b"\x8a\x08" + _Q(arg))[pick]
    if name == "MEMOIZE" and pick:
        return b"q" + bytes([memo_id]) if memo_id < 256 and pick == 1 else b"r" + _P4(memo_id)
    if name == "BINPUT" and pick:
        return b"r" + _P4(arg)
    if name == "BINGET" and pick:
        return b"j" + _P4(arg)
    if name == "EMPTY_TUPLE" and pick:
        return b"(t"
    if name in ("NEWTRUE", "NEWFALSE") and pick:
        return b"I01\n" if name == "NEWTRUE" else b"I00\n"
    if name == "BINFLOAT" and pick:
        return b"F" + repr(arg).encode() + b"\n"
    return raw


def reencode(data: bytes, rng: random.Random) -> bytes:
    """``data`` (pickles appended) with opcodes swapped for equivalent ones and FRAMEs dropped:
    a valid file that :func:`pickle.load` reads to the same objects."""
    out = []
    base = 0
    while base < len(data):
        stream = io.BytesIO(data[base:])
        ops = list(pickletools.genops(stream))
        ends = [p for _, _, p in ops[1:]] + [stream.tell()]
        memo_id = 0
        for (op, arg, pos), end in zip(ops, ends, strict=True):
            raw = data[base + (pos or 0) : base + (end or 0)]
            if op.name == "FRAME":
                continue
            out.append(_reencode_op(op.name, arg, raw, memo_id, rng))
            if op.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                memo_id += 1
        base += stream.tell()
    return b"".join(out)


def deep() -> Iterator[tuple[str, bytes]]:
    n = DEEP
    yield "lists_append", b"\x80\x04" + b"]" * n + b"a" * (n - 1) + b"."
    yield "lists_marks", b"\x80\x04" + b"(" * n + b"l" * n + b"."
    yield "tuples_marks", b"\x80\x04" + b"(" * n + b"t" * n + b"."
    yield "tuple1_chain", b"\x80\x04K\x00" + b"\x85" * n + b"."
    yield "marks_unbalanced", b"\x80\x04" + b"(" * n + b"."
    yield "marks_no_stop", b"\x80\x04" + b"(" * n
    yield "lists_unbalanced", b"\x80\x04" + b"]" * n + b"."
    yield "lists_p0", b"(" * n + b"l" * n + b"."
    yield "dicts", b"\x80\x04" + b"}K\x00" * n + b"s" * (n - 1) + b"."
    deep_x = b"]" + b"]" * n + b"a" * n  # x = [deep list]
    yield "layout_x_deep", b"\x80\x04" + deep_x + b"]K\x01a\x86."
    yield "layout_marks_deep", b"\x80\x04]" + b"(" * n + b"l" * n + b"a]K\x01a\x86."
    yield "memoized_deep", b"\x80\x04" + b"]\x94" * n + b"a" * (n - 1) + b"."


def stack() -> Iterator[tuple[str, bytes]]:
    p4 = b"\x80\x04"
    yield "get_undefined_binget", p4 + b"]h\x05a."
    yield "get_undefined_long", p4 + b"]j\x00\x00\x01\x00a."
    yield "get_undefined_text", b"(lg5\na."
    yield "get_before_put", p4 + b"h\x00q\x00."
    yield "layout_get_undefined", p4 + b"](K\x01h\x07e]K\x01a\x86."
    yield "layout_get_self", p4 + b"]\x94(K\x01h\x00h\x01e]K\x01a\x86."
    yield "mark_at_stop", p4 + b"(K\x01."
    yield "mark_only", p4 + b"(."
    yield "appends_no_mark", p4 + b"]K\x01e."
    yield "appends_no_list", p4 + b"(K\x01e."
    yield "setitems_odd", p4 + b"}(K\x01u."
    yield "setitem_no_dict", p4 + b"K\x01K\x02s."
    yield "setitem_underflow", p4 + b"}K\x01s."
    yield "append_to_int", p4 + b"K\x01K\x02a."
    yield "pop_empty", p4 + b"0."
    yield "pop_mark_empty", p4 + b"1."
    yield "pop_then_stop", p4 + b"K\x010."
    yield "dup_empty", p4 + b"2."
    yield "tuple_no_mark", p4 + b"t."
    yield "list_no_mark", p4 + b"K\x01l."
    yield "dict_no_mark", p4 + b"d."
    yield "tuple1_empty", p4 + b"\x85."
    yield "tuple3_short", p4 + b"K\x01\x87."
    yield "reduce_empty", p4 + b"R."
    yield "build_empty", p4 + b"b."
    yield "memoize_empty", p4 + b"\x94."
    yield "binput_empty", p4 + b"q\x00."
    yield "stop_empty", p4 + b"."
    yield "two_values_stop", p4 + b"K\x01K\x02."
    yield "unknown_opcode", p4 + b"\xff."
    yield "unknown_opcode_mid", p4 + b"]\x94(K\x01\xfeK\x02e."
    yield "proto_6", b"\x80\x06]."
    yield "proto_255", b"\x80\xff]."
    yield "proto_only", b"\x80\x05"
    yield "proto_cut", b"\x80"
    yield "proto_twice", b"\x80\x05\x80\x02]."
    yield "ext1_unregistered", b"\x80\x02\x82\x01."
    yield "ext4_huge", b"\x80\x02\x84\xff\xff\xff\x7f."
    yield "persid", p4 + b"K\x01Q."
    yield "persid_text", b"P1\n."
    yield "next_buffer", b"\x80\x05\x97."
    yield "readonly_buffer_empty", b"\x80\x05\x98."
    yield "stack_global_ints", p4 + b"K\x01K\x02\x93."
    yield "global_bad_text", b"cnot a module\nname\n."
    yield "int_text_bad", b"Iabc\n."
    yield "float_text_bad", b"Fx\n."
    yield "string_unquoted", b"Sabc\n."
    yield "unicode_bad_utf8", b"\x80\x04\x8c\x02\xff\xfe."
    yield "binunicode_surrogate", b"\x80\x04\x8c\x03\xed\xa0\x80."
    yield "layout_bad_utf8_item", p4 + b"](\x8c\x02\xff\xfe\x8c\x01ae](K\x01K\x02e\x86."
    yield "layout_trailing_noise", pickle.dumps(([1, 2], [3, 4]), 4) + b"\x00\xffjunk"
    yield "layout_trailing_proto0", pickle.dumps(([1, 2], [3, 4]), 4) + pickle.dumps([5], 0)
    yield "layout_then_stop", pickle.dumps(([1, 2], [3, 4]), 4) + b"."
    dup = pickle.dumps({"x": [1, 2], "z": [5, 6]}, 4).replace(b"\x8c\x01z", b"\x8c\x01x")
    yield "dict_columns_duplicate_key", dup
    yield (
        "dict_columns_equal_keys",
        pickle.dumps({1: [1, 2], 2.5: [3, 4]}, 4).replace(
            b"G@\x04\x00\x00\x00\x00\x00\x00", b"G?\xf0\x00\x00\x00\x00\x00\x00"
        ),
    )
    yield (
        "dict_rows_duplicate_key",
        pickle.dumps([{"a": 1, "b": 2}, {"a": 3, "b": 4}], 4).replace(b"\x8c\x01b", b"\x8c\x01a"),
    )
