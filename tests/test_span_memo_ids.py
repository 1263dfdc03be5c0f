"""Memo ids at read time: a span of L bytes defines at most L memo ids, so a ``PUT``/``GET`` of a
span-local id at or past that is refused (issue 12: a tampered index or data file never makes
the C unpickler allocate a memo of up to 2**32 entries), by both rewrite twins and the general
path alike, while legit files at protocols 2-5 still read exactly as ``pickle.load`` reads them.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import struct
from pathlib import Path
from typing import Any

import pytest

from pickleshard import _cscan
from pickleshard.errors import CorruptPickleError, FileChangedError, MemoIdError
from pickleshard.io.identity import FileIdentity
from pickleshard.picklekit.rewrite import rewrite_span
from pickleshard.picklekit.unpicklers import MemoIdPastSpan
from pickleshard.read import SpanReader
from pickleshard.scan import scan_file
from rewrites import write_keeping_times

TWINS = {"python": rewrite_span, "compiled": _cscan.rewrite_span}
N = 120  # samples: 3 memo ids each at protocols 2-3, so ids cross 255 (LONG_BINPUT)


def _samples() -> tuple[list[Any], list[int]]:
    xs = [[f"s{i}", {"k": f"t{i}"}, (i, f"u{i}")] for i in range(N)]
    return xs, list(range(N))


def _rewrite(rewrite: Any, data: bytes, start: int, end: int, base: int = 0) -> bytearray:
    """``data[start:end]`` rewritten with no externals."""
    read_at = lambda off, n: data[off : off + n]  # noqa: E731
    out, _, _ = rewrite(read_at, start, end, 2, base, 0, [], None)
    return out


def _ops(data: bytes, names: set[str]) -> list[tuple[int, int]]:
    """``(offset, arg)`` of every opcode of ``data`` named in ``names``."""
    return [(pos, arg) for op, arg, pos in pickletools.genops(data) if op.name in names]


# -- the twins ----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", list(TWINS))
def test_the_last_id_a_span_can_define_passes_and_the_next_is_refused(engine: str) -> None:
    rewrite = TWINS[engine]
    for ident, ok in ((2, True), (3, False)):  # the span "N q<id>" is 3 bytes long
        data = b"\x80\x02" + b"Nq" + bytes([ident]) + b"."
        if ok:
            assert pickle.loads(bytes(_rewrite(rewrite, data, 2, 5))) is None
            continue
        with pytest.raises(MemoIdPastSpan) as info:
            _rewrite(rewrite, data, 2, 5)
        assert info.value.offset == 3
        assert "BINPUT at byte 3 names memo id 3" in str(info.value)


@pytest.mark.parametrize("op", ["LONG_BINPUT", "LONG_BINGET"])
def test_both_twins_refuse_an_id_near_2_32_alike(op: str) -> None:
    """The id a crafted file would use to make the C unpickler grow its memo to 2**32 entries:
    refused by the rewrite (nothing is ever unpickled here)."""
    xs = [f"x{i}" for i in range(300)]
    data = pickle.dumps([*xs, xs[-1]], 2)  # ends in a LONG_BINGET of the last string
    pos = _ops(data, {op})[-1][0]
    bad = bytearray(data)
    bad[pos + 1 : pos + 5] = struct.pack("<I", 0xFFFF_FFF0)
    got = []
    for rewrite in TWINS.values():
        with pytest.raises(MemoIdPastSpan) as info:
            _rewrite(rewrite, bytes(bad), 2, len(bad) - 1)
        assert isinstance(info.value, pickle.UnpicklingError)
        got.append((info.value.offset, str(info.value)))
    assert got[0] == got[1]
    assert got[0][0] == pos
    assert str(0xFFFF_FFF0) in got[0][1]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("engine", list(TWINS))
def test_legit_memo_ids_past_255_still_rewrite_to_what_pickle_loads(
    engine: str, protocol: int
) -> None:
    value = _samples()
    data = pickle.dumps(value, protocol)
    assert len(_ops(data, {"LONG_BINPUT", "MEMOIZE"})) > 256
    out = _rewrite(TWINS[engine], data, 2, len(data) - 1)
    assert pickle.loads(bytes(out)) == pickle.loads(data) == value


# -- the reader: every path, with the file named ------------------------------------------------


def _file(tmp_path: Path, protocol: int) -> Path:
    path = tmp_path / f"p{protocol}.pkl"
    path.write_bytes(pickle.dumps(_samples(), protocol))
    return path


def _oracle(path: Path) -> Any:
    with open(path, "rb") as fh:
        return pickle.load(fh)


READERS = [
    pytest.param({"engine": "python"}, id="python"),
    pytest.param({"engine": "compiled"}, id="compiled"),
    pytest.param({"general": True}, id="general"),
]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("kwargs", READERS)
def test_legit_files_read_as_pickle_load_reads_them(
    tmp_path: Path, protocol: int, kwargs: dict[str, Any]
) -> None:
    path = _file(tmp_path, protocol)
    xs, ys = _oracle(path)
    reader = SpanReader(scan_file(path), **kwargs)
    got = [reader.read_sample(i) for i in range(N)] + reader.read_samples(list(range(N)))
    assert got == [(xs[i], ys[i]) for i in range(N)] * 2


def _push_id_past_span(path: Path, sample: int) -> tuple[int, int]:
    """Raise the first LONG_BINPUT id in sample ``sample``'s span by 100,000 (in place, the
    size kept): past any id the span can define; return (its offset, the new id)."""
    scan = scan_file(path)
    start, end = int(scan.starts[sample, 0]), int(scan.ends[sample, 0])
    data = path.read_bytes()
    pos, arg = next((p, a) for p, a in _ops(data, {"LONG_BINPUT"}) if start <= p < end)
    bad = bytearray(data)
    bad[pos + 1 : pos + 5] = struct.pack("<I", arg + 100_000)
    write_keeping_times(path, bytes(bad))
    return pos, arg + 100_000


@pytest.mark.parametrize("kwargs", READERS)
def test_a_crafted_file_whose_id_is_past_its_span_is_refused_naming_it(
    tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    """The data file and the index agree on its identity (a crafted pair): not a changed file,
    a memo id the span cannot hold, named with the file, the opcode's offset and the sample."""
    path = _file(tmp_path, 2)
    scan = scan_file(path)
    k = 100
    pos, new = _push_id_past_span(path, k)
    st = os.stat(path)
    ident = FileIdentity(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    reader = SpanReader(scan, identity=ident, **kwargs)
    for read in (lambda: reader.read_sample(k), lambda: reader.read_samples(list(range(80, N)))):
        with pytest.raises(MemoIdError) as info:
            read()
        err = info.value
        assert isinstance(err, CorruptPickleError)
        assert not isinstance(err, FileChangedError)
        assert (err.path, err.offset, err.sample) == (str(path), pos, k)
        assert f"names memo id {new}" in str(err)
        assert "changed" not in str(err)
    xs, ys = _samples()
    assert reader.read_sample(k - 1) == (xs[k - 1], ys[k - 1])


@pytest.mark.parametrize("kwargs", READERS)
def test_the_same_id_in_a_file_changed_since_its_scan_is_called_a_changed_file(
    tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    """When ``fstat`` says the file is no longer the one indexed (its ctime moved), the refusal
    says that."""
    path = _file(tmp_path, 3)
    st = os.stat(path)
    scan = scan_file(path)
    ident = FileIdentity(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    reader = SpanReader(scan, identity=ident, **kwargs)
    assert reader.read_sample(3) == (_samples()[0][3], 3)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a tick of ctime, at least
    pos, _ = _push_id_past_span(path, 100)
    with pytest.raises(FileChangedError) as info:
        reader.read_sample(100)
    assert (info.value.path, info.value.offset, info.value.sample) == (str(path), pos, 100)
