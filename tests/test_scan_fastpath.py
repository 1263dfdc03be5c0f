"""The array fast path's template check (``scan/fastpath.py``): the compiled
``_cscan.template_matches`` and its reference ``template_matches_py`` against a plain per-sample
definition, on spans made to match, differ in one byte, or carry a FRAME header anywhere."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pickleshard import _cscan
from pickleshard.picklekit import opcodes as oc
from pickleshard.picklekit import walk
from pickleshard.scan.fastpath import TemplateCheck, gathered, template_matches_py


def _by_definition(buf: bytes, c: TemplateCheck, cand: np.ndarray) -> list[bool]:
    """The check read off its docstring, one sample and one byte at a time."""

    def same(s: int, shift_from: int | None) -> bool:
        for j, r in enumerate(c.rel.tolist()):
            off = r + 9 if shift_from is not None and r >= shift_from else r
            if c.mask[j] and buf[s + off] != c.template[j]:
                return False
        return True

    out = []
    for k in cand.tolist():
        s = int(c.st[k])
        if c.lengths[k] == c.length:
            out.append(same(s, None))
        else:
            out.append(any(buf[s + at] == oc.FRAME_OP and same(s, at) for at in c.ats.tolist()))
    return out


def _spans(
    seed: int, n: int, length: int, rel: np.ndarray, ats: list[int]
) -> tuple[bytes, TemplateCheck]:
    """``n`` spans of random bytes with the template written at ``rel``: each kept, given a
    FRAME header at one of ``ats`` (or elsewhere), or changed in one byte."""
    rng = np.random.default_rng(seed)
    template = rng.integers(0, 256, len(rel), np.uint8)
    mask = rng.random(len(rel)) < 0.8
    parts, st_, lengths = [], [], []
    pos = 0
    for _ in range(n):
        span = rng.integers(0, 256, length, np.uint8)
        span[rel] = template
        kind = rng.integers(0, 4)
        if kind == 1:  # a FRAME header at an opcode boundary the check knows, or at another
            at = (
                int(rng.choice(ats)) if ats and rng.random() < 0.7 else int(rng.integers(0, length))
            )
            span = np.concatenate(
                [span[:at], [oc.FRAME_OP], rng.integers(0, 256, 8, np.uint8), span[at:]]
            )
        elif kind == 2:  # one byte changed (maybe one the mask ignores)
            j = int(rng.integers(0, len(rel)))
            span[rel[j]] ^= 0x5A
        gap = rng.integers(0, 256, int(rng.integers(0, 20)), np.uint8)
        parts += [gap, span]
        pos += len(gap)
        st_.append(pos)
        lengths.append(len(span))
        pos += len(span)
    buf = np.concatenate([np.zeros(0, np.uint8), *parts]).astype(np.uint8).tobytes()
    c = TemplateCheck(
        np.array(st_, np.int64),
        np.array(lengths, np.int64),
        length,
        rel,
        template,
        mask,
        np.array(ats, np.int64),
    )
    return buf, c


def _compiled(
    buf: object, c: TemplateCheck, cand: np.ndarray, release: object = None
) -> np.ndarray:
    return _cscan.template_matches(
        buf,
        c.st,
        c.lengths,
        cand,
        c.length,
        c.rel,
        c.template,
        c.mask.astype(np.uint8),
        c.ats,
        release,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 60),
    length=st.integers(8, 80),
    data=st.data(),
)
def test_template_match_twins_agree_with_the_definition(
    seed: int, n: int, length: int, data: st.DataObject
) -> None:
    rel = np.array(
        sorted(data.draw(st.sets(st.integers(0, length - 1), min_size=1, max_size=30))), np.int64
    )
    ats = sorted(data.draw(st.sets(st.integers(0, length - 1), max_size=4)))
    buf, c = _spans(seed, n, length, rel, ats)
    cand = np.array(
        sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n))) if n else [], np.int64
    )
    want = _by_definition(buf, c, cand)
    py = template_matches_py(lambda at, r: gathered(buf, at, r), c, cand)
    got = _compiled(buf, c, cand)
    assert got.dtype == py.dtype == np.bool_
    assert py.tolist() == want
    assert got.tolist() == want


def test_template_match_releases_pages_behind_it_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 14 MB of spans, mapped (as a file past walk.KEEP_MAPPED is): the compiled check calls the
    # releaser as it passes each 4 MiB block
    monkeypatch.setattr(walk, "KEEP_MAPPED", 0)
    rel = np.arange(0, 40, 3, dtype=np.int64)
    buf, c = _spans(7, 150_000, 80, rel, [41, 60])
    path = tmp_path / "spans.bin"
    path.write_bytes(buf)
    cand = np.arange(len(c.st), dtype=np.int64)
    want = template_matches_py(lambda at, r: gathered(buf, at, r), c, cand)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        drop = walk.releaser(m)
        assert drop is not None
        calls: list[int] = []
        got = _compiled(m, c, cand, lambda upto: (calls.append(upto), drop(upto)))
    assert 0 < int(want.sum()) < len(want)  # some spans match, some do not
    assert got.tolist() == want.tolist()
    assert calls == sorted(calls)
    assert len(calls) >= len(buf) >> 22
    assert calls[-1] >= int(c.st[-1])


def test_template_match_refuses_a_template_of_another_size() -> None:
    buf, c = _spans(1, 3, 20, np.arange(5, dtype=np.int64), [])
    with pytest.raises(ValueError, match="template of 4 bytes for 5 offsets"):
        _cscan.template_matches(
            buf,
            c.st,
            c.lengths,
            np.arange(3, dtype=np.int64),
            20,
            c.rel,
            c.template[:4],
            c.mask[:4].astype(np.uint8),
            c.ats,
            None,
        )


@pytest.mark.parametrize("framed", [False, True])
def test_template_bytes_past_the_buffer_raise_in_both_twins(framed: bool) -> None:
    buf, c = _spans(3, 4, 20, np.arange(0, 20, 2, dtype=np.int64), [10])
    cut = buf[: int(c.st[-1]) + (15 if framed else 10)]  # the last span cut short
    if framed:
        c = TemplateCheck(c.st, c.lengths.copy(), c.length, c.rel, c.template, c.mask, c.ats)
        c.lengths[-1] = c.length + 9
    cand = np.arange(4, dtype=np.int64)
    with pytest.raises(IndexError):
        template_matches_py(lambda at, r: gathered(cut, at, r), c, cand)
    with pytest.raises(IndexError):
        _compiled(cut, c, cand)
