"""Rewrite a span of a pickle file into a standalone pickle the C unpickler reads.

:func:`rewrite_span` (pure Python, the reference; ``pickleshard._cscan.rewrite_span`` is its
compiled twin, both stepping with :func:`~pickleshard.picklekit.extent.extent`) copies a span's opcodes with FRAME headers dropped and memo ids renumbered, after
a prologue that stores the span's external values at memo ids ``0..k-1``: as persistent ids by
default, or by value with :func:`literal_head` (immutable values and vetted globals), which lets
the result load with plain :func:`pickle.loads`. It counts the opcodes that name a global, so a
caller knows when the allowlist's ``find_class`` hook is needed at all.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

from . import opcodes as oc
from .compiled import require
from .extent import SHORT, extent
from .fastdump import fast_opcodes
from .renumber import GETS, PUTS, encode_get, encode_put, proto_head, step_error
from .spanfile import WINDOW
from .unpicklers import MemoIdPastSpan

__all__ = [
    "BIG",
    "FindClass",
    "HookedUnpickler",
    "MemoIdPastSpan",
    "literal_head",
    "rewrite_span",
]

BIG = 64 * 1024
FindClass = Callable[[str, str], Any]
_MAX_LITERAL = 256  # bytes of one value's opcodes in a literal prologue; larger ones are shared
_MAX_HEAD = 4096  # bytes of a whole literal prologue


def rewrite_span(
    read_at: Callable[[int, int], bytes],
    start: int,
    end: int,
    protocol: int,
    memo_base: int,
    shift: int,
    externals: Sequence[int],
    read_payload: Callable[[int, int, int], Any] | None = None,
    big: int = BIG,
    head: bytes | None = None,
) -> tuple[bytearray, list[Any], int]:
    """Rewrite span ``[start, end)`` into a standalone pickle; return ``(pickle, buffers,
    finds)``, ``finds`` counting the span's opcodes that name a global (``GLOBAL``,
    ``STACK_GLOBAL``, ``INST``, ``EXT*``: with none, loading it never calls ``find_class``).

    ``externals`` are the span's external memo keys, stored at memo ids ``0..k-1`` by the
    prologue: by default persistent id ``j`` must resolve to the value of ``externals[j]``;
    ``head`` replaces that prologue (one that pushes and stores the values itself). The span is
    read in windows of 64 KiB; a ``bytes``/``bytearray`` payload of at least ``big`` bytes that
    does not fit in the current window is read by ``read_payload(offset, length, kind)`` (kind
    ``P_BYTES`` or ``P_BYTEARRAY``) and passed out of band. Raises ``EOFError`` if the file ends
    early or an opcode runs past ``end``.
    """
    n_ext = len(externals)
    local = {k: j for j, k in enumerate(externals)} if n_ext else {}
    limit = n_ext + end - start  # a span's own ids: fewer than its bytes (see MemoIdPastSpan)
    out = bytearray(proto_head(protocol, n_ext) if head is None else head)
    buffers: list[Any] = []
    finds = 0
    finds_class, copy_step, form_of, head_of = oc.FINDS_CLASS, oc.COPY_STEP, oc.FORM, oc.HEAD
    action_of, payload_of = oc.ACTION, oc.PAYLOAD
    F_LEN1, F_LEN8U, A_GET, A_PUT, A_FRAME = oc.F_LEN1, oc.F_LEN8U, oc.A_GET, oc.A_PUT, oc.A_FRAME
    P_BYTES, P_BYTEARRAY = oc.P_BYTES, oc.P_BYTEARRAY
    gets, puts, unpack4 = GETS, PUTS, oc.U4
    here = start  # file offset of buf[0]
    buf = read_at(here, min(end - here, WINDOW))
    blen = len(buf)
    i = mark = 0
    while True:
        if i >= blen:  # window done; a plain opcode or payload may run on into the next one
            out += buf[mark:blen]
            here += blen
            if here >= end:
                if here > end or i > blen:
                    raise EOFError(f"an opcode runs past the span end {end}")
                break
            i -= blen
            buf = read_at(here, min(end - here, max(WINDOW, i + 16)))
            blen, mark = len(buf), 0
            if not blen:
                raise EOFError(f"file ends at byte {here}, inside a span ending at {end}")
            continue
        op = buf[i]
        step = copy_step[op]
        if step:
            i += step
            continue
        nxt = extent(buf, i, end - here)
        if nxt == SHORT:  # the opcode's head is cut by the window: read again from it
            need = head_of[op] if form_of[op] <= F_LEN8U else blen - i + WINDOW
            out += buf[mark:i]
            here += i
            buf = read_at(here, min(end - here, max(WINDOW, 2 * need)))
            blen, i, mark = len(buf), 0, 0
            if blen < min(end - here, need):  # else the same short read again, forever
                raise EOFError(f"file ends at byte {here + blen}, inside a span ending at {end}")
            continue
        if nxt < 0:
            raise step_error(nxt, buf, i, here, end)
        form = form_of[op]
        if F_LEN1 <= form <= F_LEN8U:
            n = nxt - i - head_of[op]
            if (
                nxt > blen
                and n >= big
                and read_payload is not None
                and payload_of[op] in (P_BYTES, P_BYTEARRAY)
            ):
                out += buf[mark:i]
                out.append(oc.NEXT_BUFFER_OP)
                buffers.append(read_payload(here + nxt - n, n, payload_of[op]))
                here += nxt  # resume after the payload, in a new window
                buf = read_at(here, min(end - here, WINDOW))
                blen, i, mark = len(buf), 0, 0
                continue
            i = nxt
            continue
        if finds_class[op]:
            finds += 1
        act = action_of[op]
        if act in (A_GET, A_PUT, A_FRAME):
            out += buf[mark:i]
            mark = nxt
            if act != A_FRAME:
                ident = (  # by form: a text id ("p100\n") may be as long as a binary one
                    int(buf[i + 1 : nxt - 1])
                    if form != oc.F_FIXED
                    else buf[i + 1]
                    if nxt - i == 2
                    else unpack4(buf, i + 1)[0]
                )
                key = ident + shift
                new = local[key] if act == A_GET and key < memo_base else n_ext + key - memo_base
                if new < 0:  # a PUT below the span's first id: the file changed since the scan
                    raise pickle.UnpicklingError(
                        f"{oc.OPNAME[op]} at byte {here + i} stores memo id {ident} below the span's"
                    )
                if new >= limit:
                    raise MemoIdPastSpan(op, here + i, ident, start, end)
                table = gets if act == A_GET else puts
                out += (
                    table[new]
                    if new < 256
                    else (encode_get(new) if act == A_GET else encode_put(new))
                )
        i = nxt
    out.append(oc.STOP_OP)
    return out, buffers, finds


_LITERAL_LEAVES = (str, int, float, bool, type(None))
_NAMED = (type, types.FunctionType, types.BuiltinFunctionType)


def _fast_dumps(value: Any, protocol: int) -> bytes:
    """The opcodes that push ``value``, storing nothing in the memo (no PROTO, FRAME or STOP)."""
    # fast mode: nothing is stored in the memo, so the prologue's memo ids stay 0..k-1
    return b"".join(fast_opcodes(value, protocol))


def _literal(value: Any, protocol: int, find_class: FindClass | None) -> bytes | None:
    """Opcodes that push ``value`` itself (a global: the same object) or an equal value of the
    same type, without the memo; None for values that have none (mutable ones, arrays...)."""
    kind = type(value)
    leaf = _LITERAL_LEAVES + ((bytes,) if protocol >= 3 else ())  # protocol 2 bytes are REDUCEs
    if kind in leaf or (kind is tuple and len(value) < 16 and all(type(v) in leaf for v in value)):
        body = _fast_dumps(value, protocol)
        return body if len(body) <= _MAX_LITERAL else None  # big values: shared, not copied
    if isinstance(value, _NAMED):
        module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
        if not isinstance(module, str) or module not in sys.modules or not name.isidentifier():
            return None  # never import a module the file did not already need
        try:
            found = find_class(module, name) if find_class else value
            plain = getattr(sys.modules[module], name)  # what a plain pickle.loads finds
        except Exception:
            return None
        return b"c" + f"{module}\n{name}\n".encode() if found is value is plain else None
    return None


def literal_head(
    protocol: int, values: Sequence[Any], find_class: FindClass | None
) -> bytes | None:
    """A prologue that stores ``values`` at memo ids ``0..k-1`` by value (no persistent ids), so
    a rewritten span loads with plain :func:`pickle.loads`; None unless every value has a
    literal (see :func:`_literal`). Checked by loading it back: each value comes out equal, of the
    same type (globals: the same object)."""
    parts = [bytes((oc.PROTO_OP, protocol))]
    for j, v in enumerate(values):
        body = _literal(v, protocol, find_class)
        if body is None:
            return None
        parts.append(body + encode_put(j) + bytes((oc.POP_OP,)))
    head = b"".join(parts)
    if len(head) > _MAX_HEAD:
        return None
    probe = head + b"(" + b"".join(encode_get(j) for j in range(len(values))) + b"t."
    try:
        back = pickle.loads(probe) if find_class is None else _probe(probe, find_class)
    except Exception:
        return None
    same = len(back) == len(values) and all(
        type(b) is type(v) and (b is v or (not isinstance(v, _NAMED) and b == v))
        for b, v in zip(back, values, strict=True)
    )
    return head if same else None


def _probe(data: bytes, find_class: FindClass) -> Any:
    return HookedUnpickler(io.BytesIO(data), find_class).load()


def _compiled_rewrite() -> Callable[..., tuple[bytearray, list[Any], int]]:
    return require().rewrite_span  # type: ignore[no-any-return]


class HookedUnpickler(pickle.Unpickler):
    """The C unpickler with a caller's ``find_class``."""

    def __init__(self, file: Any, find_class: FindClass, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self._find_class_hook = find_class

    def find_class(self, module: str, name: str) -> Any:
        return self._find_class_hook(module, name)
