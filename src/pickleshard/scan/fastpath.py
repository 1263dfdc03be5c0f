"""Fast-path detection: fields whose samples can be read without unpickling their spans.

:func:`int_item` finds a field of small ints (one ``BININT*`` opcode per span);
:func:`array_item` a field of numpy arrays that all share one *template* (the bytes around the
payload, memo PUT ids aside), proved by comparing those bytes in every sample
(:func:`gathered`, or its compiled twin ``pickleshard._cscan.gather``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..picklekit import opcodes as oc
from ..picklekit.extent import extent
from ..picklekit.spanfile import WINDOW
from ..picklekit.walk import releaser
from ..picklekit.walker import RELEASE_SHIFT
from ..safety.standins import ArraySpec
from .model import MAX_TEMPLATE, ArrayItem, IntItem

__all__ = ["TemplateCheck", "array_item", "gathered", "int_item", "template_matches_py"]


class Inspector(Protocol):
    """What the fast-path checks read a file through (a
    :class:`~pickleshard.scan.inspector.Inspector`): its bytes, a gather of bytes at offsets, the
    inert value of a span, and the counter of bytes examined."""

    buf: Any
    window: int
    bytes_read: int

    def gather(self, at: np.ndarray, rel: np.ndarray) -> np.ndarray: ...

    def matches(self, check: TemplateCheck, cand: np.ndarray) -> np.ndarray: ...

    def value(self, start: int, end: int) -> Any: ...


_MAX_EXCEPTIONS = 1024  # samples of a field read by span; beyond, the field has no ArrayItem
_CHUNK = 8192  # samples compared at a time


_BINARY_FORMS = (oc.F_FIXED, oc.F_LEN1, oc.F_LEN4S, oc.F_LEN4U, oc.F_LEN8U)


def _template_mask(
    buf: Any, start: int, pay: int, pay_end: int, end: int
) -> tuple[np.ndarray, list[int]] | None:
    """Which bytes of the template span outside its payload must be equal in another sample:
    all but memo PUT ids (numbering differs per sample); and the opcode boundaries after the
    payload (offsets from its end), where a FRAME header may stand in another sample. None if
    its opcodes do not end exactly at the payload and at ``end``."""
    mask = np.ones((pay - start) + (end - pay_end), bool)
    bounds = [0]
    for lo, hi, base in ((start, pay, 0), (pay_end, end, pay - start)):
        i = lo
        while i < hi:
            op = buf[i]
            if oc.FORM[op] not in _BINARY_FORMS:  # text forms (protocol 0 lines), bad bytes
                return None
            head = i + 1 + oc.ARGLEN[op]
            # the payload's own opcode ends at its header: its bytes follow
            nxt = pay if lo == start and head == pay else extent(buf, i, hi)
            if oc.ACTION[op] == oc.A_PUT:
                mask[base + i + 1 - lo : base + nxt - lo] = False
            if nxt <= i or nxt > hi:
                return None
            i = nxt
            if lo == pay_end:
                bounds.append(i - pay_end)
    return mask, bounds


def gathered(buf: Any, at: np.ndarray, rel: np.ndarray, release: bool = True) -> np.ndarray:
    """``buf[at[k] + rel]`` for every ``k``, a ``(len(at), len(rel))`` uint8 array.

    An mmap is read 4 MiB of offsets at a time, each window's pages dropped from this process
    after it (as the opcode walk does, see :func:`pickleshard.picklekit.walk.releaser`): touching a
    few bytes of every sample would otherwise map most of a file of big samples (not with
    ``release=False``: see :func:`pickleshard.scan.access.scan_view`).
    """
    out = np.empty((len(at), len(rel)), np.uint8)
    if not len(at):
        return out
    order = np.argsort(at, kind="stable")
    cuts = np.flatnonzero(np.diff(at[order] >> RELEASE_SHIFT)) + 1
    drop = releaser(buf) if release else None  # None for bytes and small mappings too
    u8 = np.frombuffer(buf, np.uint8)
    try:
        for part in np.split(order, cuts):  # in offset order, so releases only move forward
            out[part] = u8[at[part][:, None] + rel]
            if drop is not None:
                drop(int(at[part[-1]]) + int(rel.max()) + 1)
    finally:
        del u8
    return out


@dataclass(frozen=True)
class TemplateCheck:
    """What :func:`template_matches_py` (and its compiled twin ``_cscan.template_matches``)
    compares: sample ``k``'s span starts at ``st[k]`` and is ``lengths[k]`` long; the template's
    bytes ``template`` lie at offsets ``rel`` of a span ``length`` long, those where ``mask``
    is False (memo PUT ids) not compared; a span 9 bytes longer holds a FRAME header at one of
    the offsets ``ats`` (the suffix's opcode boundaries), the bytes from there on 9 later."""

    st: np.ndarray
    lengths: np.ndarray
    length: int
    rel: np.ndarray
    template: np.ndarray
    mask: np.ndarray
    ats: np.ndarray


def template_matches_py(
    gather: Callable[[np.ndarray, np.ndarray], np.ndarray], c: TemplateCheck, cand: np.ndarray
) -> np.ndarray:
    """For each sample ``cand[k]`` (those of ``c.length`` or 9 more), whether its span has the
    template's bytes (see :class:`TemplateCheck`), read by ``gather`` (:func:`gathered` of the
    file), :data:`_CHUNK` samples at a time: the reference of ``_cscan.template_matches``."""
    out = np.zeros(len(cand), bool)
    for lo in range(0, len(cand), _CHUNK):  # chunks: temporaries of a few MB at most
        c_ = cand[lo : lo + _CHUNK]
        plain = c.lengths[c_] == c.length
        rows = np.flatnonzero(plain)
        got = gather(c.st[c_[rows]], c.rel)
        out[lo + rows] = ((got == c.template) | ~c.mask).all(axis=1)
        rows = np.flatnonzero(~plain)
        for at in c.ats.tolist():  # the same bytes with a FRAME header at boundary ``at``
            if not len(rows):
                break
            where = np.where(c.rel < at, c.rel, c.rel + 9)
            got = gather(c.st[c_[rows]], np.concatenate([[at], where]))
            ok = (got[:, 0] == oc.FRAME_OP) & ((got[:, 1:] == c.template) | ~c.mask).all(axis=1)
            out[lo + rows[ok]] = True
            rows = rows[~ok]
    return out


def int_item(insp: Inspector, st: np.ndarray, en: np.ndarray) -> IntItem | None:
    """An :class:`IntItem` if every span of the field is one small-int opcode, else None."""
    lengths = en - st
    if int(lengths.max()) > 5 + 9:
        return None
    ops = insp.gather(st, np.zeros(1, np.int64))[:, 0]
    ok = np.zeros(len(st), bool)
    for op, size in oc.INT_SPAN.items():
        mine = ops == op
        framed = mine & (lengths == size + 9)
        ok |= mine & (lengths == size)
        ok[framed] = insp.gather(st[framed] + size, np.zeros(1, np.int64))[:, 0] == oc.FRAME_OP
    insp.bytes_read += len(st)
    return IntItem() if bool(ok.all()) else None


def array_item(
    insp: Inspector,
    st: np.ndarray,
    en: np.ndarray,
    ext_lo: np.ndarray,
    ext_hi: np.ndarray,
    ext_keys: np.ndarray,
) -> ArrayItem | None:
    """An :class:`ArrayItem` for a field whose spans are numpy arrays, or None.

    A *template* span (the first after sample 0 of the most common length) is inspected; a later
    sample is read straight from its payload when its span has the template's bytes outside the
    payload (memo PUT ids aside; optionally followed by one FRAME header) and the same externals:
    then its opcodes build the same kind of array from its own payload. Each GET names the same
    memo id as the template's; one that is internal to the template is external to a later
    sample, which then has other externals, so equal externals prove equal meaning. Earlier
    samples and any that differ are exceptions, read by span.
    """
    n = len(st)
    lengths = en - st
    values = np.sort(lengths[1:])  # the most common span length, without np.unique
    cut = np.flatnonzero(np.diff(values)) + 1
    counts = np.diff(np.concatenate([[0], cut, [len(values)]]))
    values = values[np.concatenate([[0], cut])]
    common = int(values[counts.argmax()])
    if (
        common - 9 in values
    ):  # the common length holds a FRAME header: the plain one is the template
        common -= 9
    t = 1 + int(np.argmax(lengths[1:] == common))
    s0, length = int(st[t]), int(lengths[t])
    insp.window = 1024  # small reads: never a payload it skips over
    try:
        spec = insp.value(s0, s0 + length)
    finally:
        insp.window = WINDOW
    if (
        not isinstance(spec, ArraySpec)
        or spec.problem is not None
        or spec.payload is None
        or spec.dtype is None
        or spec.payload.kind not in ("bytes", "bytearray")
    ):
        return None
    pay, plen = spec.payload.offset, spec.payload.length
    pre, post = pay - s0, length - (pay - s0) - plen
    if pre <= 0 or post < 0 or pre + post > MAX_TEMPLATE:
        return None
    walked = _template_mask(insp.buf, s0, pay, pay + plen, s0 + length)
    if walked is None:
        return None
    mask, bounds = walked
    rel = np.concatenate([np.arange(pre), pre + plen + np.arange(post)]).astype(np.int64)
    t_ext = ext_keys[ext_lo[t] : ext_hi[t]]
    cand = np.flatnonzero((lengths == length) | (lengths == length + 9))
    cand = cand[(cand > t) & ((ext_hi[cand] - ext_lo[cand]) == len(t_ext))]
    if len(t_ext):  # equal externals, in chunks: temporaries of a few MB at most
        cand = np.concatenate(
            [cand[:0]]
            + [
                c[(ext_keys[ext_lo[c][:, None] + np.arange(len(t_ext))] == t_ext).all(axis=1)]
                for c in (cand[lo : lo + _CHUNK] for lo in range(0, len(cand), _CHUNK))
            ]
        )
    template = insp.gather(np.array([s0], np.int64), rel)[0]
    check = TemplateCheck(st, lengths, length, rel, template, mask, pre + plen + np.array(bounds))
    ok = insp.matches(check, cand)
    insp.bytes_read += len(cand) * (pre + post + 1)
    direct = np.zeros(n, bool)
    direct[t] = True
    direct[cand[ok]] = True
    exceptions = np.nonzero(~direct)[0]
    if len(exceptions) > _MAX_EXCEPTIONS:
        return None
    dtype = spec.dtype.newbyteorder("=") if spec.swap else spec.dtype
    readonly = spec.frombuffer and spec.payload.kind == "bytes"
    head, tail = template[:pre].tobytes(), template[pre:].tobytes()
    return ArrayItem(
        dtype,
        spec.shape,
        spec.swap,
        readonly,
        pre,
        tuple(exceptions.tolist()),
        head,
        tail,
        _ranges(~mask[:pre]),
        _ranges(~mask[pre:]),
        tuple(bounds),
    )


def _ranges(flags: np.ndarray) -> tuple[tuple[int, int], ...]:
    """The ``[lo, hi)`` runs of True in ``flags``."""
    edges = np.flatnonzero(np.diff(np.concatenate([[False], flags, [False]]).astype(np.int8)))
    return tuple((int(lo), int(hi)) for lo, hi in edges.reshape(-1, 2))
