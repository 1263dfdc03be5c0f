"""The compiled opcode walker (``_cscan.pyx``) against its reference (``walker.walk_record``):
built and used in the dev install, equal results on valid pickles, the same exceptions (class,
message, offset) on damaged ones."""

from __future__ import annotations

import functools
import io
import mmap
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picklegen import assert_same, build, datasets, dumps, values
from pickleshard import _cscan
from pickleshard import scan as scan_module
from pickleshard.errors import PickleshardError
from pickleshard.io import open_source
from pickleshard.picklekit import walk
from pickleshard.picklekit.rewrite import rewrite_span as py_rewrite_span
from pickleshard.picklekit.unpicklers import MemoIdPastSpan
from pickleshard.picklekit.walker import RELEASE_SHIFT, Walked
from pickleshard.read import SpanReader
from pickleshard.scan import ScanResult, scan_bytes, scan_file
from pickleshard.scan import fastpath as fastpath_module
from pickleshard.scan.access import choose_pattern
from pickleshard.scan.fastpath import gathered
from pickleshard.testing.oracle import reference_samples

ENGINES = ("python", "compiled")
Outcome = tuple[Any, ...]


def _walked(w: Walked) -> Outcome:
    return (
        w.protocol,
        w.roots,
        w.records,
        w.defs.tolist(),
        w.get_offs.tolist(),
        w.get_keys.tolist(),
        w.skipped,
    )


def _scanned(s: ScanResult) -> Outcome:
    # bytes_fetched measures the storage (what the page cache held), not the scan
    return (
        {**s.meta(), "bytes_fetched": None},
        {k: v.tolist() for k, v in s.arrays_dict().items()},
    )


def _outcome(run: Callable[[], Any], facts: Callable[[Any], Outcome]) -> Outcome:
    try:
        result = run()
    except Exception as exc:  # every exception counts: the twins must agree on all of them
        return ("raised", type(exc), str(exc), getattr(exc, "offset", None))
    return ("returned", facts(result))


def _assert_twins(data: bytes) -> None:
    """Walk and scan ``data`` with both engines: same results, or the same exception."""
    walks = [
        _outcome(lambda e=e: walk.walk_opcodes(data, len(data), "t.pkl", engine=e), _walked)
        for e in ENGINES
    ]
    assert walks[0] == walks[1]
    scans = [_outcome(lambda e=e: scan_bytes(data, "t.pkl", engine=e), _scanned) for e in ENGINES]
    assert scans[0] == scans[1]


# The globals the generated values pickle (containers, numbers, text, numpy, torch, fractions,
# datetimes): damaged bytes may name another global, which neither the oracle nor the reader runs.
_VALUE_MODULES = frozenset(
    ("copyreg", "_codecs", "collections", "fractions", "datetime", "numpy", "torch")
)
_VALUE_BUILTINS = frozenset(
    ("set", "frozenset", "bytearray", "bytes", "complex", "list", "tuple", "dict", "int", "float")
)


class _ValueUnpickler(pickle.Unpickler):
    """``pickle.load`` of the generated values, refusing any other global."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _VALUE_BUILTINS:
            return super().find_class(module, name)
        if module.partition(".")[0] not in _VALUE_MODULES:
            raise pickle.UnpicklingError(f"global {module}.{name} is not one the values use")
        return super().find_class(module, name)


def _value_global(module: str, name: str) -> Any:
    return _ValueUnpickler(io.BytesIO()).find_class(module, name)


def _loaded(data: bytes) -> list[Any] | None:
    """Every pickle of ``data`` by ``pickle.load``, one call per appended pickle; None when
    any call fails."""
    fh, objs = io.BytesIO(data), []
    try:
        while fh.tell() < len(data):
            objs.append(_ValueUnpickler(fh).load())
    except Exception:
        return None
    return objs


def _assert_reads_as_pickle_load(data: bytes) -> None:
    """Each engine's scan of ``data`` read back sample by sample against ``pickle.load`` of the
    whole file: a scan that succeeds reads every sample as ``pickle.load`` gives it (fields and
    count by the documented layout rules), or, when ``pickle.load`` fails, fails to read one with
    a package error; a scan that fails raises a package error."""
    objs = _loaded(data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.pkl"
        path.write_bytes(data)
        for engine in ENGINES:
            try:
                scan = scan_file(path, engine=engine)
            except PickleshardError:
                continue
            want = reference_samples(objs, os.fspath(path)) if objs else None
            if want is not None:
                assert (scan.fields, scan.num_samples) == (want[0], len(want[1])), engine
            refused = 0
            with SpanReader(scan, engine=engine, find_class=_value_global) as reader:
                for i in range(scan.num_samples):
                    try:
                        got = reader.read_sample(i)
                    except PickleshardError:
                        assert want is None, f"{engine}: sample {i} refused, pickle.load reads it"
                        refused += 1
                        continue
                    if want is not None:
                        assert_same(got, want[1][i], _path=f"{engine}: sample {i}")
            assert want is not None or refused, f"{engine}: every sample reads, pickle.load fails"


def test_the_extension_is_built_and_used() -> None:
    # The dev install (`make`, `pip install -e .`) builds it: a missing build must fail here.
    assert Path(_cscan.__file__).suffix in (".so", ".pyd")
    assert walk.compiled_walker() is _cscan.walk_record
    assert scan_module.ENGINE == "compiled"
    scan = scan_bytes(pickle.dumps(([1], [2])))
    assert scan.engine == "compiled"
    assert SpanReader(scan).engine == "compiled"


def test_engine_names() -> None:
    assert walk.resolve_engine("auto") == "compiled"
    assert walk.resolve_engine("python") == "python"
    with pytest.raises(ValueError, match="engine must be one of"):
        scan_bytes(pickle.dumps(([1], [2])), engine="fast")


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=datasets())
def test_twins_agree_on_every_layout(data: dict[str, Any]) -> None:
    objs = build(data["layout"], data["columns"], data["names"])
    _assert_twins(b"".join(dumps(o, data["protocol"], numpy1=data["numpy1"]) for o in objs))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(obj=values(), protocol=st.integers(0, 5))
def test_twins_agree_on_any_object(obj: Any, protocol: int) -> None:
    _assert_twins(pickle.dumps(obj, protocol=protocol))


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A valid pickle, truncated, with bytes flipped or overwritten, or with bytes inserted."""
    obj = draw(values())
    data = bytearray(pickle.dumps(([obj, obj], [1, "a"]), protocol=draw(st.integers(2, 5))))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["cut", "flip", "byte", "insert"]))
        # a position drawn apart from the length: a value drawn again may pickle to another
        # length (equal strings one object or two: a memo GET or not), which Hypothesis
        # reports as data generation that depends on external state
        i = draw(st.integers(0, 1 << 16)) % max(len(data), 1)
        if how == "cut":
            del data[i:]
        elif how == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif how == "byte" and data:
            data[i] = draw(st.integers(0, 255))
        else:
            data[i:i] = draw(st.binary(min_size=1, max_size=9))
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=damaged())
def test_twins_raise_the_same_errors_on_damaged_bytes(data: bytes) -> None:
    _assert_twins(data)
    _assert_reads_as_pickle_load(data)


@st.composite
def repeated(draw: st.DrawFn) -> bytes:
    """A list of values of one shape (the compiled walk replays such runs instead of stepping
    through them): arrays, strings, bytes, fractions, frozensets, datetimes, each sample its own
    object with its own content; some samples a value shared with another (a memo GET); long
    enough runs that FRAME headers fall inside them; sometimes damaged."""
    import datetime
    from fractions import Fraction

    n = draw(st.integers(2, 60))
    kind = draw(st.sampled_from(["array", "text", "bytes", "fraction", "set", "date", "mixed"]))
    size = draw(st.integers(1, 3000))
    dtype = draw(st.sampled_from(["<f4", ">i2", "u1", "<c8"]))

    def one(i: int, k: str) -> Any:
        if k == "array":
            return np.full((size,), i % 7, dtype)
        if k == "text":
            return chr(97 + i % 26) * size
        if k == "bytes":
            return bytes([i % 256]) * size
        if k == "fraction":
            return Fraction(i + 1, size + 1)
        if k == "set":
            return frozenset({i, i + size})
        if k == "date":
            return datetime.date(2000 + i % 20, 1 + i % 12, 1)
        return one(i, draw(st.sampled_from(["array", "text", "set"])))

    xs = [one(i, kind) for i in range(n)]
    shared = draw(st.sampled_from([None, [1, 2], "shared" * 5, np.zeros(3)]))
    for j in draw(st.lists(st.integers(0, n - 1), max_size=3)):
        xs[j] = shared if shared is not None else xs[j]
    for j in draw(st.lists(st.integers(1, n - 1), max_size=2)):
        xs[j] = xs[j - 1]  # the same object again: a GET where a run had a value
    data = bytearray(pickle.dumps((xs, list(range(n))), protocol=draw(st.integers(2, 5))))
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(len(data) // 3, len(data) - 1))
        how = draw(st.sampled_from(["cut", "flip", "frame"]))
        if how == "cut":
            del data[i:]
        elif how == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        else:  # a FRAME header whose length runs past the end
            data[i:i] = b"\x95" + (len(data) * 2).to_bytes(8, "little")
    return bytes(data)


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=repeated())
def test_twins_agree_on_runs_of_repeated_values(data: bytes) -> None:
    _assert_twins(data)
    _assert_reads_as_pickle_load(data)


def test_the_compiled_walk_replays_runs_instead_of_stepping_through_them() -> None:
    xs = [np.full((3, 32, 32), i, np.float32) for i in range(2000)]
    data = pickle.dumps((xs, list(range(2000))), protocol=5)  # FRAME headers every ~5 arrays
    _assert_twins(data)
    before = _cscan.replayed_values()
    walk.walk_opcodes(data, len(data), "t.pkl", engine="compiled")
    assert _cscan.replayed_values() - before >= 1990  # all but the first few of the arrays
    before = _cscan.replayed_values()
    data4 = pickle.dumps((xs, list(range(2000))), protocol=3)  # BINPUT ids differ per sample
    walk.walk_opcodes(data4, len(data4), "t.pkl", engine="compiled")
    assert _cscan.replayed_values() == before


_BIG = 80 << 20  # bigger than what a scan keeps mapped: the gathers release pages as they go


@pytest.fixture(scope="module")
def big_random_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gather") / "f.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, _BIG, np.uint8).tobytes())
    return path


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    at=st.lists(st.integers(0, _BIG - 64), max_size=200),
    rel=st.lists(st.integers(0, 63), min_size=1, max_size=40),
)
def test_gather_twins_read_the_same_bytes_and_release_the_same_pages(
    big_random_file: Path, at: list[int], rel: list[int]
) -> None:
    a, r = np.array(at, np.int64), np.array(rel, np.int64)
    with open(big_random_file, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        made = walk.releaser(m)
        assert made is not None
        calls: list[list[int]] = [[], []]

        def spy(k: int) -> Callable[[int], None]:
            def release(upto: int) -> None:
                calls[k].append(upto)
                made(upto)

            return release

        real = fastpath_module.releaser
        fastpath_module.releaser = lambda buf: spy(0)  # type: ignore[assignment]
        try:
            want = gathered(m, a, r)
        finally:
            fastpath_module.releaser = real
        got = _cscan.gather(m, a, r, spy(1))
    assert got.dtype == want.dtype == np.uint8
    assert np.array_equal(got, want)
    assert calls[0] == calls[1]


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x02]p99999999999999999999999\n.",  # a text memo id too large for C: the reference
        b"\x80\x02]p-3\n0g-3\n.",
        b"\x80\x02(I1\nI2\ntp0\n0g0\n.",
        b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff.",
        b"\x80\x02T\xff\xff\xff\xff.",
        b"\x80\x05\x96" + b"\xff" * 8,
    ],
)
def test_twins_agree_on_edge_cases(data: bytes) -> None:
    _assert_twins(data)


def test_the_mapping_closes_after_a_compiled_walk_fails(tmp_path: Path) -> None:
    path = tmp_path / "cut.pkl"
    path.write_bytes(pickle.dumps((list(range(100)), [np.ones(3)] * 100), protocol=5)[:-40])
    with open(path, "rb") as fh:
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    with pytest.raises(Exception, match="stream ends"):
        walk.walk_opcodes(buf, len(buf), str(path), engine="compiled")
    buf.close()  # BufferError if the compiled walker still held a view of it
    with pytest.raises(Exception, match="stream ends"):
        scan_file(path, engine="compiled")


def _payload(offset: int, n: int, kind: int) -> Any:
    return ("payload", offset, n, kind)


def _rewrites(data: bytes, scan: ScanResult, damage: int | None = None) -> list[Outcome]:
    """Every pickle span of ``scan`` rewritten by both twins, as (python, compiled) outcomes;
    the file's byte ``damage`` (if given) is changed after the scan."""
    if damage is not None:
        data = data[:damage] + bytes([data[damage] ^ 0x5A]) + data[damage + 1 :]
    reads: list[list[tuple[int, int]]] = [[], []]
    outcomes = []
    for i in range(scan.num_samples):
        for f, kind in enumerate(scan.kinds):
            if kind != "pickle":
                continue
            start = int(scan.starts[i, f])
            rec = int(np.searchsorted(scan.records[:, 0], start, "right")) - 1
            args = {
                "start": start,
                "end": int(scan.ends[i, f]),
                "protocol": scan.protocol,
                "memo_base": int(scan.memo_base[i, f]),
                "shift": int(scan.records[rec, 2]),
                "externals": scan.externals(i, f).tolist(),
                "read_payload": _payload,
                "big": 1024,
            }
            pair = []
            twins = (py_rewrite_span, _cscan.rewrite_span)
            for log, rewrite in zip(reads, twins, strict=True):

                def read_at(offset: int, n: int, log: list[tuple[int, int]] = log) -> bytes:
                    log.append((offset, n))
                    return data[offset : offset + n]

                run = functools.partial(rewrite, read_at, **args)
                pair.append(_outcome(run, lambda r: (bytes(r[0]), r[1], r[2])))
            outcomes.append(tuple(pair))
    assert reads[0] == reads[1]
    return outcomes


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=datasets(), where=st.floats(0, 1), damage=st.booleans())
def test_rewrite_twins_agree(data: dict[str, Any], where: float, damage: bool) -> None:
    objs = build(data["layout"], data["columns"], data["names"])
    raw = b"".join(dumps(o, data["protocol"], numpy1=data["numpy1"]) for o in objs)
    try:
        scan = scan_bytes(raw, "t.pkl")
    except Exception:  # not span-indexable: nothing to rewrite
        return
    at = min(int(where * len(raw)), len(raw) - 1) if damage else None
    for python, compiled in _rewrites(raw, scan, at):
        assert python == compiled


@pytest.mark.parametrize(
    ("span", "file_end", "error"),
    [
        (b"T\xfb\xff\xff\xffK\x01", None, pickle.UnpicklingError),  # negative BINSTRING length
        (b"K\x01" * 10 + b"\x8e" + b"\xff" * 8, None, EOFError),  # a length beyond any span
        (b"M\x01\x00" * 30_000, 65_537, EOFError),  # the file ends inside the span, mid-opcode
        (b"\x8c\x05abcde\x94", None, None),
    ],
)
def test_rewrite_twins_on_edge_cases(
    span: bytes, file_end: int | None, error: type[Exception] | None
) -> None:
    data = span[:file_end] if file_end is not None else span
    outcomes = []
    for rewrite in (py_rewrite_span, _cscan.rewrite_span):
        run = functools.partial(
            rewrite,
            lambda offset, n: data[offset : offset + n],
            0,
            len(span),
            protocol=4,
            memo_base=0,
            shift=0,
            externals=[],
        )
        outcomes.append(_outcome(run, lambda r: (bytes(r[0]), r[1], r[2])))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1] is error if error else outcomes[0][0] == "returned"


@pytest.mark.parametrize(
    ("span", "memo_base", "shift", "error"),
    [
        (b"K\x01q\x00", 5, 0, pickle.UnpicklingError),  # a PUT below the span's first id
        (b"K\x01r\x00\x00\x00\x00", 3, 1, pickle.UnpicklingError),
        # an id past the 7 ids a 7-byte span can define (also past 32 bits: never encoded)
        (b"K\x01r\xff\xff\xff\xff", 0, 10, MemoIdPastSpan),
        (b"K\x01r\x06\x00\x00\x00", 0, 0, None),  # the last id it can define: renumbered
        (b"K\x01r\x07\x00\x00\x00", 0, 0, MemoIdPastSpan),  # the next: refused
        (b"K\x01" + b"N0" * 127 + b"r\x00\x01\x00\x00", 0, 0, None),  # LONG_BINPUT 256: stays long
        (b"K\x01q\x07h\x07", 7, 0, None),  # a PUT and a GET renumbered from 0
        (b"K\x01p100\n", 100, 0, None),  # a text id as long as a 4-byte binary one
        (b"K\x01p7\ng7\n", 7, 0, None),  # text ids as long as 1-byte binary ones
        (b"K\x01g\n", 0, 0, ValueError),  # an empty text id
        # 64-bit sums would overflow: an id past the span, in Python ints
        (b"K\x01h\xff", -(2**62 - 1), 2**62 - 1, MemoIdPastSpan),
    ],
)
def test_rewrite_twins_renumber_memo_ids_alike(
    span: bytes, memo_base: int, shift: int, error: type[Exception] | None
) -> None:
    outcomes = [
        _outcome(
            functools.partial(
                rewrite,
                lambda offset, n: span[offset : offset + n],
                0,
                len(span),
                protocol=4,
                memo_base=memo_base,
                shift=shift,
                externals=[],
            ),
            lambda r: (bytes(r[0]), r[1], r[2]),
        )
        for rewrite in (py_rewrite_span, _cscan.rewrite_span)
    ]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1] is error if error else outcomes[0][0] == "returned"
    if error is None:  # renumbered as pickle reads the ids: the rewritten span loads
        assert pickle.loads(outcomes[0][1][0]) == 1
    text_ids = {b"K\x01p100\n": b"K\x01q\x00", b"K\x01p7\ng7\n": b"K\x01q\x00h\x00"}
    if span in text_ids:  # a text id read as text, whatever its length
        assert outcomes[0][1][0] == b"\x80\x04" + text_ids[span] + b"."


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("sparse", [False, True])
def test_walks_unmap_the_pages_they_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, sparse: bool
) -> None:
    # 70 MB of 12 KB arrays, read "sequential": fault-around would map the whole file, so the
    # walk unmaps what it passed. 70 MB of 600 KB arrays, read "random": only the pages the
    # walk touches are mapped (a page or two a sample), kept until the scan unmaps the file,
    # and the fast path's checks of every sample's head find them there.
    n, shape = (120, (3, 224, 224)) if sparse else (5800, (3, 32, 32))
    xs = [np.full(shape, i, np.float32) for i in range(n)]
    path = tmp_path / "big.pkl"
    path.write_bytes(pickle.dumps((xs, list(range(n))), protocol=5))
    with open_source(path) as source:
        assert choose_pattern(source) == ("random" if sparse else "sequential")
    releasers: list[list[int]] = []  # the offsets each releaser was called with, in order made
    make = walk.releaser

    def spy(buf: Any) -> Any:
        release = make(buf)
        releasers.append(calls := [])
        return release and (lambda upto: (calls.append(upto), release(upto)))

    monkeypatch.setattr(walk, "releaser", spy)
    scan = scan_file(path, engine=engine)
    if sparse:
        assert releasers == []  # neither the walk nor the checks drop pages
    else:
        released = releasers[0]  # the walk's (the scan's later checks make their own)
        assert len(released) == path.stat().st_size >> RELEASE_SHIFT  # once per block passed
        assert released == sorted(released)
    assert _scanned(scan) == _scanned(scan_bytes(path.read_bytes(), str(path), engine="python"))
