"""split: chunks are plain pickles of the source's layout whose samples, in order, are the source's."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picklegen import assert_same, build, datasets, oracle, write
from pickleshard.errors import (
    FileChangedError,
    NotSpanIndexableError,
    OutputExistsError,
    UnsafePickleError,
    UnsupportedLayoutError,
)
from pickleshard.io.identity import FileIdentity
from pickleshard.pipelines.split.run import MANIFEST, split
from pickleshard.pipelines.split.source import SpanSource
from pickleshard.read import SpanReader
from pickleshard.safety.policy import UnpicklePolicy
from pickleshard.scan import scan_file
from pickleshard.scan.layouts import decode_layout

pytestmark = pytest.mark.filterwarnings("ignore:numpy.core:DeprecationWarning")


def _pickles(path: Path) -> list[Any]:
    objs = []
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        while fh.tell() < size:
            objs.append(pickle.load(fh))
    return objs


def _containers(obj: Any) -> tuple[type, tuple[type, ...]]:
    cols = list(obj.values()) if isinstance(obj, dict) else list(obj)
    return type(obj), tuple(type(c) for c in cols)


def _check_split(src: Path, out: Path, **limits: Any) -> list[Path]:
    names, want = oracle(src)
    report = split(src, out, **limits)
    objs = _pickles(src)
    layout = json.loads((out / MANIFEST).read_text())["layout"]
    samples_per_pickle = layout in ("samples", "dict_samples")
    got: list[tuple[Any, ...]] = []
    source_layout = None if samples_per_pickle else decode_layout(objs[0], src)
    for chunk in report.chunks:
        with open(chunk, "rb") as fh:
            head = fh.read(2)
        assert head == bytes((0x80, max(2, _protocol(src)))), chunk
        parts = _pickles(chunk)
        if source_layout is None:
            got += [p if len(names) > 1 or type(p) is tuple else (p,) for p in parts]
            continue
        assert len(parts) == 1, chunk
        decoded = decode_layout(parts[0], chunk)
        assert decoded.layout == source_layout.layout
        assert decoded.fields == source_layout.fields
        if decoded.layout in ("columns", "dict_columns"):
            assert _containers(parts[0]) == _containers(objs[0])
        chunk_samples = list(zip(*decoded.columns, strict=True))
        if not report.whole_file:  # a chunk of a span-indexable file is span-indexable too
            with SpanReader(scan_file(chunk)) as reader:
                for k, want_k in enumerate(chunk_samples):
                    for gf, wf in zip(reader.read_sample(k), want_k, strict=True):
                        assert_same(gf, wf, _path=f"{chunk.name} sample {k} through the scanner")
        got += chunk_samples
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert len(g) == len(w)
        # identity across fields of one sample is not kept in column layouts; within one is
        for f, (gf, wf) in enumerate(zip(g, w, strict=True)):
            assert_same(gf, wf, _path=f"sample {i} field {f}")
    if limits.get("max_samples"):
        assert all(
            len(_samples_of(c, source_layout is None)) <= limits["max_samples"]
            for c in report.chunks
        )
    return report.chunks


def _samples_of(chunk: Path, per_pickle: bool) -> list[Any]:
    parts = _pickles(chunk)
    if per_pickle:
        return parts
    return list(zip(*decode_layout(parts[0], chunk).columns, strict=True))


def _protocol(path: Path) -> int:
    with open(path, "rb") as fh:
        head = fh.read(2)
    return head[1] if head[:1] == b"\x80" else 0


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=datasets(),
    limit=st.one_of(
        st.integers(1, 5).map(lambda n: {"max_samples": n}),
        st.integers(1, 3000).map(lambda n: {"max_bytes": n}),
        st.tuples(st.integers(1, 4), st.integers(50, 5000)).map(
            lambda t: {"max_samples": t[0], "max_bytes": t[1]}
        ),
    ),
)
def test_chunks_concatenate_to_the_source(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any], limit: dict[str, int]
) -> None:
    tmp = tmp_path_factory.mktemp("split")
    objs = build(data["layout"], data["columns"], data["names"])
    src = write(tmp / "src.pickle", objs, data["protocol"], numpy1=data["numpy1"])
    try:
        oracle(src)
    except UnsupportedLayoutError:
        with pytest.raises((NotSpanIndexableError, UnsupportedLayoutError)):
            split(src, tmp / "out", **limit)
        return
    _check_split(src, tmp / "out", **limit)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("top", [tuple, list, "dict"])
def test_array_and_list_fields_keep_their_containers(
    tmp_path: Path, protocol: int, top: Any
) -> None:
    n = 2500  # several APPENDS batches
    x = np.arange(n * 6, dtype=">f4").reshape(n, 2, 3)
    y = list(range(n))
    z = tuple(f"s{i}" for i in range(n))
    cols = [x, y, z]
    obj = {"x": x, "y": y, "z": z} if top == "dict" else top(cols)
    src = tmp_path / "src.pickle"
    src.write_bytes(pickle.dumps(obj, protocol=protocol))
    chunks = _check_split(src, tmp_path / "out", max_samples=1100)
    assert [p.name for p in chunks] == [f"src-{k:05d}.pickle" for k in range(3)]
    first = _pickles(chunks[0])[0]
    xs = first["x"] if top == "dict" else first[0]
    assert xs.shape == (1100, 2, 3)  # dtype: checked against pickle.load by _check_split


def test_max_bytes_cuts_by_pickled_size(tmp_path: Path) -> None:
    src = tmp_path / "big.pickle"
    xs = [np.full(1000, i, np.float64) for i in range(40)]  # ~8 KB a sample
    src.write_bytes(pickle.dumps((xs, list(range(40))), protocol=5))
    chunks = _check_split(src, tmp_path / "out", max_bytes=40_000)
    assert 8 <= len(chunks) <= 10
    assert all(c.stat().st_size < 45_000 for c in chunks)


def test_rerun_resumes_and_reports_done(tmp_path: Path) -> None:
    src = tmp_path / "d.pickle"
    src.write_bytes(pickle.dumps(([b"a" * 100] * 50, list(range(50))), protocol=4))
    out = tmp_path / "out"
    first = split(src, out, max_samples=10)
    assert len(first.chunks) == 5
    assert not first.already_done
    assert json.loads((out / MANIFEST).read_text())["complete"] is True
    again = split(src, out, max_samples=10)
    assert again.already_done
    assert again.chunks == first.chunks
    # a run killed after two chunks: the manifest is incomplete and three chunks are missing
    manifest = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps({**manifest, "complete": False}))
    for c in first.chunks[2:]:
        c.unlink()
    (out / (first.chunks[3].name + ".tmp-999")).write_bytes(b"partial")
    resumed = split(src, out, max_samples=10)
    assert resumed.chunks_reused == 2
    assert not resumed.already_done
    assert not list(out.glob("*.tmp-*"))
    _check_split(src, out, max_samples=10)
    first.chunks[0].unlink()  # a chunk lost after the split completed is written again
    again = split(src, out, max_samples=10)
    assert not again.already_done
    assert again.chunks_reused == 4
    _check_split(src, out, max_samples=10)


def test_other_limits_need_overwrite(tmp_path: Path) -> None:
    src = tmp_path / "d.pickle"
    src.write_bytes(pickle.dumps((list(range(30)), list(range(30))), protocol=5))
    out = tmp_path / "out"
    split(src, out, max_samples=10)
    with pytest.raises(OutputExistsError, match="overwrite"):
        split(src, out, max_samples=7)
    report = split(src, out, max_samples=7, overwrite=True)
    assert len(report.chunks) == 5
    assert sorted(p.name for p in out.glob("*.pickle")) == [p.name for p in report.chunks]


def test_restricted_unpickling_applies(tmp_path: Path) -> None:
    src = tmp_path / "d.pickle"
    src.write_bytes(pickle.dumps(([Path("a"), Path("b")], [0, 1]), protocol=5))
    with pytest.raises(UnsafePickleError, match="pathlib"):
        split(src, tmp_path / "out", max_samples=1)
    report = split(src, tmp_path / "ok", max_samples=1, trusted=True)
    assert _pickles(report.chunks[1])[0] == ([Path("b")], [1])


def test_refused_file_loads_whole_within_budget_else_names_file_and_reason(
    tmp_path: Path,
) -> None:
    src = tmp_path / "p1.pickle"
    src.write_bytes(pickle.dumps(([1, 2, 3], [4, 5, 6]), protocol=1))
    report = split(src, tmp_path / "out", max_samples=2)
    assert report.whole_file
    assert [_pickles(c)[0] for c in report.chunks] == [([1, 2], [4, 5]), ([3], [6])]
    with pytest.raises(NotSpanIndexableError, match=r"p1\.pickle.*protocol 0 or 1.*budget"):
        split(src, tmp_path / "out2", max_samples=2, memory_bytes=10)


def test_needs_a_limit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes or max_samples"):
        split(tmp_path / "x.pickle", tmp_path / "out")


@pytest.mark.parametrize("protocol", [2, 5])
def test_one_sample_per_pickle_files(tmp_path: Path, protocol: int) -> None:
    for name, samples in (
        ("dicts", [{"x": np.arange(i), "y": i} for i in range(7)]),
        ("tuples", [(np.arange(i), i) for i in range(7)]),
        ("bare", [[i, str(i)] for i in range(7)]),
    ):
        src = tmp_path / f"{name}.pickle"
        src.write_bytes(b"".join(pickle.dumps(s, protocol=protocol) for s in samples))
        report = split(src, tmp_path / name, max_samples=3)
        got = [o for c in report.chunks for o in _pickles(c)]
        assert len(report.chunks) == 3
        assert len(got) == 7
        for g, w in zip(got, samples, strict=True):
            assert_same(g, w)


_CHILD = r"""
import json, os, resource, sys
import numpy as np
from pickleshard.scan import scan_file
from pickleshard.pipelines.split.run import split

src, out, headroom = sys.argv[1], sys.argv[2], int(sys.argv[3])
size = os.path.getsize(src)
# The scanner maps the file read-only: address space the size of the file, but no memory.
# Scan first, then limit the address space for the split itself.
scan = scan_file(src)

def vm_bytes():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmSize:"))

base = vm_bytes()
resource.setrlimit(resource.RLIMIT_AS, (base + headroom, resource.RLIM_INFINITY))
try:
    hog = bytearray(size)
except MemoryError:
    pass
else:
    raise SystemExit("the address-space limit does not bite")
report = split(src, out, max_bytes=32 << 20, scan=scan)
print(json.dumps({
    "chunks": [str(c) for c in report.chunks],
    "base": base,
    "limit": base + headroom,
}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmSize from /proc")
def test_splits_a_file_larger_than_the_memory_it_may_use(tmp_path: Path) -> None:
    import subprocess
    import sys

    from pickleshard.read import SpanReader
    from pickleshard.scan import scan_file

    n, row = 300, 1 << 18  # 300 samples of 1 MiB: a 300 MiB file
    src = tmp_path / "big.pickle"
    with open(src, "wb") as fh:
        xs = [np.full(row, i, np.float32) for i in range(n)]
        pickle.dump((xs, [f"label{i}" for i in range(n)]), fh, protocol=5)
        del xs
    size = src.stat().st_size
    headroom = size // 3  # far less than the file, enough for numpy, the reader and a chunk's I/O
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(src), str(tmp_path / "out"), str(headroom)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["limit"] - result["base"] < size  # maxrss counts the scan's file pages: no use
    chunks = [Path(c) for c in result["chunks"]]
    assert len(chunks) >= size // (32 << 20)
    with SpanReader(scan_file(src)) as reader:
        i = 0
        for chunk in chunks:
            with open(chunk, "rb") as fh:
                xs, ys = pickle.load(fh)
            assert isinstance(xs, list)
            assert isinstance(ys, list)
            for x, y in zip(xs, ys, strict=True):
                want_x, want_y = reader.read_sample(i)
                assert y == want_y
                assert x.dtype == want_x.dtype
                assert np.array_equal(x, want_x)
                i += 1
            del xs, ys
    assert i == n


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pickleshard.cli import main

    src = tmp_path / "big.pickle"
    src.write_bytes(pickle.dumps(([np.zeros(100) for _ in range(10)], list(range(10))), protocol=5))
    out = tmp_path / "parts"
    assert main(["split", str(src), str(out), "--max-bytes", "2KiB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 10
    assert report["chunks"][0] == "big-00000.pickle"
    assert len(report["chunks"]) >= 5
    assert main(["split", str(src), str(out), "--max-bytes", "2KiB"]) == 0
    assert "already holds this split" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["split", str(src), str(out)])
    assert "--max-bytes SIZE or --max-samples N" in capsys.readouterr().err
    assert main(["split", str(tmp_path / "missing.pickle"), str(out), "--max-samples", "2"]) == 1
    assert "missing.pickle" in capsys.readouterr().err


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_rows_keep_identity_within_a_row_and_big_payloads(tmp_path: Path, protocol: int) -> None:
    shared = np.arange(30_000, dtype=np.float64)  # 240 KB: written outside pickle frames
    rows = [(shared, shared, 0), (np.ones(3), np.zeros(20_000), 1), (b"x" * 70_000, "s", 2)]
    src = tmp_path / "rows.pickle"
    src.write_bytes(pickle.dumps(rows, protocol=protocol))
    report = split(src, tmp_path / "out", max_samples=2)
    got = [r for c in report.chunks for r in _pickles(c)[0]]
    for g, w in zip(got, rows, strict=True):
        assert_same(g, w)
    assert got[0][0] is got[0][1]


@pytest.mark.parametrize(
    "sample",
    [[np.array([], dtype=bool), b""], [np.array([7], dtype=np.uint8), b"\x07"]],
    ids=["empty", "one-byte"],
)
def test_bytes_equal_to_an_arrays_data_stay_bytes(tmp_path: Path, sample: list[Any]) -> None:
    # CPython's pure-Python pickler memoized the (shared singleton) bytes copy of an in-band
    # PickleBuffer, so the later equal bytes came back as the array's bytearray.
    src = tmp_path / "src" / "a.pkl"
    src.parent.mkdir()
    src.write_bytes(pickle.dumps(([None, None], [None, sample]), protocol=5))
    report = split(src, tmp_path / "parts", max_samples=1)
    with open(report.chunks[-1], "rb") as fh:
        got = pickle.load(fh)[1][0]
    assert type(got[1]) is bytes
    assert got[1] == sample[1]
    np.testing.assert_array_equal(got[0], sample[0])


def test_datetime_array_field_splits_at_protocol_5(tmp_path: Path) -> None:
    # numpy pickles datetime64/timedelta64 arrays with _reconstruct + __setstate__ even at
    # protocol 5, whose data must then be bytes, not the bytearray _frombuffer takes.
    src = tmp_path / "src" / "a.pkl"
    src.parent.mkdir()
    column = np.arange(6).astype("timedelta64[ms]")
    src.write_bytes(pickle.dumps(([None] * 6, column), protocol=5))
    report = split(src, tmp_path / "parts", max_samples=4)
    got = []
    for chunk in report.chunks:
        with open(chunk, "rb") as fh:
            got.append(pickle.load(fh)[1])
    np.testing.assert_array_equal(np.concatenate(got), column)
    assert all(g.dtype == column.dtype for g in got)


# -- array rows are copied raw: the file's identity is checked after them (issue 12) -----------


def _rows_file(tmp_path: Path, base: float) -> bytes:
    x = np.arange(40 * 64, dtype=np.float32).reshape(40, 64) + np.float32(base)
    return pickle.dumps({"x": x}, 4)


def _rewrite_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # ctime moves, at least one tick
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


def test_array_rows_copied_from_a_file_changed_since_its_scan_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "rows.pkl"
    path.write_bytes(_rows_file(tmp_path, 0.0))
    scan = scan_file(path)
    assert scan.kinds == ("array_row",)
    st = path.stat()
    identity = FileIdentity(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    src = SpanSource(scan, UnpicklePolicy(), identity)
    try:
        got = bytearray()
        src.rows(0, 0, 10).fill(got.extend)
        assert bytes(got) == pickle.loads(path.read_bytes())["x"][:10].tobytes()
        _rewrite_keeping_size_and_mtime(path, _rows_file(tmp_path, 0.5))
        with pytest.raises(FileChangedError) as info:
            src.rows(0, 10, 20).fill(bytearray().extend)
        assert info.value.path == str(path)
        assert "after reading samples 10, 11" in str(info.value)
    finally:
        src.close()


def test_split_refuses_a_file_changed_while_it_splits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that lands after the scan (same size, mtime put back): the rows it would copy are
    neither the scanned data nor checked; split names the file instead."""
    import pickleshard.pipelines.split.source as splitsource

    path = tmp_path / "rows.pkl"
    path.write_bytes(_rows_file(tmp_path, 0.0))
    real_scan = splitsource.scan_file

    def scan_then_write(*args: Any, **kwargs: Any) -> Any:
        scan = real_scan(*args, **kwargs)
        _rewrite_keeping_size_and_mtime(path, _rows_file(tmp_path, 0.5))
        return scan

    monkeypatch.setattr(splitsource, "scan_file", scan_then_write)
    with pytest.raises(FileChangedError, match=r"rows\.pkl"):
        split(path, tmp_path / "out", max_samples=7)
    assert not list((tmp_path / "out").glob("*.pickle"))


def test_split_refuses_a_dtype_edited_in_sample_0_while_later_samples_refer_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-sample arrays name their dtype by a memo GET of the one sample 0 defines: an edit
    there (``f4`` -> ``i4``, size and mtime kept) after the reader settled would turn every later
    sample into float32 bytes where ``pickle.load`` now reads int32. The file's identity (its
    ctime moved) refuses it."""
    path = tmp_path / "items.pkl"
    xs = [np.full((8, 8), i, np.float32) for i in range(40)]
    path.write_bytes(pickle.dumps((xs, list(range(40))), 5))
    real_value, reads = SpanSource.value, []

    def value_then_edit(self: SpanSource, f: int, i: int) -> Any:
        reads.append(i)
        if len(reads) == 20:
            raw = bytearray(path.read_bytes())
            at = raw.index(b"f4")
            raw[at : at + 2] = b"i4"
            _rewrite_keeping_size_and_mtime(path, bytes(raw))
        return real_value(self, f, i)

    monkeypatch.setattr(SpanSource, "value", value_then_edit)
    with pytest.raises(FileChangedError, match=r"items\.pkl.*ctime"):
        split(path, tmp_path / "out", max_samples=40)
    assert len(reads) == 20  # the first read after the edit
