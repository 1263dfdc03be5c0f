"""pickleshard.scan.scratch: a local file's scan read with pread into a reused buffer.

The oracle is ``pickle.load`` (through :func:`picklegen.oracle`): a scan through a scratch that
holds an earlier file's bytes (and garbage) reads every sample as ``pickle.load`` does, and gives
the mapped scan's facts, errors and index. The compiled ``fill_examined`` is checked against its
Python reference and against the file's own bytes at every opcode the scan steps on.
"""

from __future__ import annotations

import json
import mmap
import os
import pickle
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picklegen import assert_same, build, datasets, oracle, write
from pickleshard import _cscan, build_index
from pickleshard.errors import PickleshardError
from pickleshard.picklekit.extent import extent
from pickleshard.picklekit.opcodes import F_LEN1, F_LEN8U, FORM, HEAD
from pickleshard.read import SpanReader
from pickleshard.scan import ScanResult, access, scan_file
from pickleshard.scan import scratch as scratch_module
from pickleshard.scan.scratch import (
    MOST,
    WINDOW,
    ScanScratch,
    current_scratch,
    fill_examined_py,
    learned_window,
    scratch_scope,
)
from pickleshard.scan.sparse import SKIP


def _facts(s: ScanResult) -> tuple[Any, ...]:
    return (s.meta(), {k: v.tolist() for k, v in s.arrays_dict().items()})


def _outcome(path: Path, scratch: bool) -> tuple[Any, ...]:
    """The scan's facts (read through a scratch scope, or mapped), or the error it raised."""
    try:
        if not scratch:
            return _facts(scan_file(path))
        with scratch_scope() as held:
            # garbage where the scan reads nothing: what it must never read
            held._resize(os.path.getsize(path))
            assert held._map is not None
            held._map[:] = b"\xab" * len(held._map)
            got = _facts(scan_file(path))
            assert held.files == 1
            return got
    except PickleshardError as exc:
        return (type(exc), str(exc), exc.offset)


def _examined(data: bytes) -> list[tuple[int, int]]:
    """The ``[start, end)`` of every opcode header and short payload on the extent chain."""
    pos, out = 0, []
    while pos < len(data):
        nxt = extent(data, pos, len(data))
        if nxt < 0:
            out.append((pos, pos + 1))
            break
        head = HEAD[data[pos]]
        short = not F_LEN1 <= FORM[data[pos]] <= F_LEN8U or nxt - pos - head < SKIP
        out.append((pos, nxt if short else pos + head))
        pos = nxt
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=datasets())
def test_a_scan_through_the_scratch_reads_as_pickle_load(spec: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.pkl"
        objs = build(spec["layout"], spec["columns"], spec["names"])
        write(path, objs, spec["protocol"], numpy1=spec["numpy1"])
        mapped = _outcome(path, scratch=False)
        assert _outcome(path, scratch=True) == mapped
        if isinstance(mapped[0], type):  # refused alike
            return
        names, want = oracle(path)
        with scratch_scope():
            scan = scan_file(path)
        assert scan.fields == names
        with SpanReader(scan) as reader:
            for i in range(scan.num_samples):
                assert_same(reader.read_sample(i), want[i], _path=f"sample {i}")


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    spec=datasets(),
    cut=st.one_of(st.none(), st.integers(1, 400)),
    window=st.sampled_from([16, 64, WINDOW]),
)
def test_fill_examined_compiled_and_reference_read_the_bytes_the_scan_steps_on(
    spec: dict[str, Any], cut: int | None, window: int
) -> None:
    data = pickle.dumps(build(spec["layout"], spec["columns"], spec["names"]), spec["protocol"])
    if cut is not None:
        data = data[: max(1, len(data) - cut)]  # a truncated file: the chain stops at the cut
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.pkl"
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            compiled, reference = bytearray(b"\xab" * len(data)), bytearray(b"\xab" * len(data))
            got = _cscan.fill_examined(fd, compiled, len(data), window, MOST, SKIP)
            assert fill_examined_py(fd, reference, len(data), window, MOST, SKIP) == got
        finally:
            os.close(fd)
    assert compiled == reference
    for lo, hi in _examined(data):
        assert compiled[lo:hi] == data[lo:hi], f"bytes [{lo}, {hi}) not read"


def test_learned_window_is_the_last_need_doubled_within_bounds() -> None:
    assert [learned_window(n, WINDOW) for n in (0, 1, 16, 17, 29, 40, 127, 128, 5000)] == [
        32,
        32,
        32,
        64,
        64,
        96,
        256,
        256,
        256,
    ]
    assert learned_window(29, 16) == 16  # never past the window asked for


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_samples_alike_are_read_once_each_in_a_window_of_their_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: int
) -> None:
    rng = np.random.default_rng(protocol)
    samples = [rng.random((3, 32, 32)).astype(np.float32) for _ in range(300)]
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps((samples, list(range(300))), protocol=protocol))
    data = path.read_bytes()
    reads: list[int] = []
    real = os.pread

    def counted(fd: int, n: int, at: int) -> bytes:
        reads.append(n)
        return real(fd, n, at)

    monkeypatch.setattr(os, "pread", counted)
    out = bytearray(b"\xab" * len(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        got = fill_examined_py(fd, out, len(data), WINDOW, MOST, SKIP)
        monkeypatch.undo()
        compiled = bytearray(b"\xab" * len(data))
        assert _cscan.fill_examined(fd, compiled, len(data), WINDOW, MOST, SKIP) == got
    finally:
        os.close(fd)
    assert compiled == out
    for lo, hi in _examined(data):
        assert out[lo:hi] == data[lo:hi], f"bytes [{lo}, {hi}) not read"
    # one read a sample (and a few for the head and the labels), each far under the first
    # window once learned: the opcodes between two payloads are under 100 bytes
    assert len(reads) <= 300 + 10, len(reads)
    assert sorted(reads)[len(reads) // 2] < WINDOW, reads[:20]


def test_bad_bytes_give_the_same_error_through_the_scratch(tmp_path: Path) -> None:
    good = pickle.dumps([np.ones((3, 40, 40), np.float32) for _ in range(5)], protocol=5)
    for k, data in enumerate(
        [good[:-300], good[:100] + b"\xff" + good[101:], good + b"junk", good[:1]]
    ):
        path = tmp_path / f"bad{k}.pkl"
        path.write_bytes(data)
        mapped = _outcome(path, scratch=False)
        assert _outcome(path, scratch=True) == mapped


def test_the_scratch_is_used_in_its_scope_only_and_for_files_that_fit(tmp_path: Path) -> None:
    path = tmp_path / "a.pkl"
    path.write_bytes(pickle.dumps([np.zeros(3000, np.float32) for _ in range(40)], protocol=5))
    assert current_scratch() is None
    with scratch_scope() as held:
        assert current_scratch() is held
        scan_file(path)
        scan_file(path)
        assert held.files == 2
        assert 0 < held.bytes_read < 2 * path.stat().st_size
        with scratch_scope(budget=100) as small:  # too small: mapped as before
            assert current_scratch() is small
            scan_file(path)
            assert small.files == 0
        assert current_scratch() is held
    assert current_scratch() is None


def test_a_view_held_past_the_scan_does_not_stop_the_next_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pkl", tmp_path / "b.pkl"
    a.write_bytes(pickle.dumps([np.zeros(3000, np.float32) for _ in range(40)], protocol=5))
    b.write_bytes(pickle.dumps([np.ones(2000, np.float32) for _ in range(30)], protocol=5))
    scratch = ScanScratch()
    fa, fb = os.open(a, os.O_RDONLY), os.open(b, os.O_RDONLY)
    try:
        view = memoryview(scratch.read(fa, a.stat().st_size))
        buf = scratch.read(fb, b.stat().st_size)  # not resized under the view: a new map
        assert isinstance(buf, mmap.mmap)
        assert len(buf) == b.stat().st_size
        assert view[:1] == pickle.dumps(None, protocol=5)[:1]  # the old map, still readable
        view.release()
    finally:
        os.close(fa)
        os.close(fb)
        scratch.close()


def test_an_index_built_through_the_scratch_is_the_mapped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(1)
    data = tmp_path / "data"
    data.mkdir()
    for k in range(3):
        rows = [
            {"x": rng.random((3, 16 * (k + 1), 16), dtype=np.float32), "y": k, "t": f"s{k}"}
            for _ in range(50)
        ]
        with open(data / f"p{k}.pkl", "wb") as fh:
            pickle.dump(rows, fh, protocol=4 + k % 2)

    def contents(index: Path) -> tuple[Any, ...]:
        header = json.loads((index / "index.json").read_text())
        arrays = {k: np.load(index / v).tolist() for k, v in sorted(header["arrays"].items())}
        for k in ("arrays", "checksums"):
            header.pop(k)
        return header, arrays

    build_index(data, index=tmp_path / "read")
    monkeypatch.setattr(access, "current_scratch", lambda: None)  # every file mapped
    build_index(data, index=tmp_path / "mapped")
    assert contents(tmp_path / "read") == contents(tmp_path / "mapped")


def test_a_dense_file_storage_must_deliver_is_read_whole_and_scans_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dense.pkl"
    rows = [(np.full((3, 8, 8), i, np.float32), i) for i in range(300)]
    path.write_bytes(pickle.dumps(rows, protocol=5))
    mapped = _outcome(path, scratch=False)
    monkeypatch.setattr(scratch_module, "_cached", lambda fd, size: False)
    with scratch_scope() as held:
        assert _facts(scan_file(path)) == mapped
        assert held.bytes_read == path.stat().st_size  # read whole
    with scratch_scope() as held, SpanReader(scan_file(path)) as reader:
        for i in range(len(rows)):
            assert_same(reader.read_sample(i), rows[i], _path=f"sample {i}")


def _arrays_file(path: Path, n: int = 200) -> bytes:
    data = pickle.dumps(([np.full((3, 8, 8), i, np.float32) for i in range(n)], list(range(n))))
    path.write_bytes(data)
    return data


@contextmanager
def _fill_thread(path: Path) -> Iterator[tuple[Any, int]]:
    """A new FillThread and a descriptor of ``path``, both closed when the block ends."""
    filler = _cscan.FillThread()
    fd = os.open(path, os.O_RDONLY)
    try:
        yield filler, fd
    finally:
        os.close(fd)
        filler.close()


@pytest.mark.parametrize("mode", [scratch_module.FILL_READ, scratch_module.FILL_WHOLE])
def test_the_fill_thread_fills_as_the_caller_would(tmp_path: Path, mode: int) -> None:
    assert (_cscan.FILL_READ, _cscan.FILL_WHOLE) == (
        scratch_module.FILL_READ,
        scratch_module.FILL_WHOLE,
    )
    path = tmp_path / "a.pkl"
    data = _arrays_file(path, 3000)
    with _fill_thread(path) as (filler, fd):
        assert filler.tid > 0
        out = bytearray(b"\xab" * len(data))
        filler.submit(fd, out, len(data), mode, WINDOW, MOST, SKIP)
        with pytest.raises(ValueError, match="in flight"):
            filler.submit(fd, out, len(data), mode, WINDOW, MOST, SKIP)
        got = filler.wait()
        want = bytearray(b"\xab" * len(data))
        assert fill_examined_py(fd, want, len(data), WINDOW, MOST, SKIP) == (
            len(data) if mode == scratch_module.FILL_WHOLE else got
        )
    if mode == scratch_module.FILL_WHOLE:
        assert got == len(data)
        assert out == data
    else:
        assert out == want
    for lo, hi in _examined(data):
        assert out[lo:hi] == data[lo:hi], f"bytes [{lo}, {hi}) not read"
    with pytest.raises(ValueError, match="closed"):
        filler.submit(0, out, 1, mode, WINDOW, MOST, SKIP)


@pytest.mark.parametrize("mode", [0, 1])
def test_the_fill_thread_reports_a_file_cut_short(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "cut.pkl"
    size = len(_arrays_file(path, 2000))
    os.truncate(path, 4096)
    with _fill_thread(path) as (filler, fd):
        out = bytearray(size)
        filler.submit(fd, out, size, mode, WINDOW, MOST, SKIP)  # the size it had
        with pytest.raises(OSError, match="ended before byte"):
            filler.wait()
        with pytest.raises(ValueError, match="no fill"):
            filler.wait()
        out.append(0)  # no longer held: it may be resized


def test_the_fill_thread_holds_its_buffer_until_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "a.pkl"
    data = _arrays_file(path, 500)
    out = bytearray(len(data))
    with _fill_thread(path) as (filler, fd):
        filler.submit(fd, out, len(data), 0, WINDOW, MOST, SKIP)
        with pytest.raises(BufferError):
            out.append(0)
        filler.close()  # waits for the fill in flight, then lets the buffer go
        out.append(0)


def test_a_forked_child_neither_uses_nor_joins_its_parents_fill_thread(tmp_path: Path) -> None:
    path = tmp_path / "a.pkl"
    data = _arrays_file(path, 200)
    out = bytearray(len(data))
    with _fill_thread(path) as (filler, fd):
        pid = os.fork()
        if pid == 0:  # the child: a copy of the struct, no thread
            code = 1
            try:
                filler.submit(fd, out, len(data), 0, WINDOW, MOST, SKIP)
            except ValueError as exc:
                code = 0 if "forked" in str(exc) else 2
            filler.close()  # returns: nothing to join here
            del filler
            os._exit(code)
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the child hung on its parent's fill thread")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
        filler.submit(fd, out, len(data), 0, WINDOW, MOST, SKIP)  # the parent's still works
        assert filler.wait() > 0
