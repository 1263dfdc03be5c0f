"""SpanReader: every sample of every layout equals ``pickle.load`` of the whole file."""

from __future__ import annotations

import os
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from picklegen import assert_same, build, datasets, oracle, write
from pickleshard.errors import (
    CorruptPickleError,
    FileChangedError,
    NotSpanIndexableError,
    TruncatedPickleError,
    UnsupportedLayoutError,
)
from pickleshard.picklekit.rewrite import rewrite_span
from pickleshard.read import BATCH_READ_MIN, SpanReader
from pickleshard.scan import ScanResult, scan_file
from rewrites import write_keeping_times

# pickles written with numpy 1.x module paths load through numpy's deprecated numpy.core shims
pytestmark = pytest.mark.filterwarnings("ignore:numpy.core:DeprecationWarning")

# Reasons the scanner may give for a generated file it will not read span by span.
# "lie inside another": appended pickles sharing objects read as chunks are refused instead of
# being retried as one sample per pickle (a known scanner gap; those files are read whole).
_ALLOWED_REFUSALS = (
    "cannot establish",
    "cannot evaluate",
    "differs from the first",
    "lie inside another",
)


def _check_file(path: Path, protocol: int = 5, **reader_kwargs: Any) -> ScanResult | None:
    encoding = {k: v for k, v in reader_kwargs.items() if k == "encoding"}
    try:
        names, want = oracle(path)
    except UnsupportedLayoutError:  # not a layout at all: the scanner must not claim it is
        with pytest.raises((NotSpanIndexableError, UnsupportedLayoutError)):
            scan_file(path, **encoding)
        return None
    try:
        scan = scan_file(path, **encoding)
    except NotSpanIndexableError as exc:
        refusal = exc
    else:
        refusal = None
    if refusal is not None:
        array_field_at_2 = protocol == 2 and refusal.reason.startswith("a field is a numpy array")
        # one pickle that is one sample holding a dict, a None or a frozenset (``([], {})``):
        # the scanner reads such a sample in place only when its other values are plain
        # scalars; whole-file mode reads it
        one_sample = len(want) == 1 and (
            "are not all sequences" in refusal.reason or "not a sequence" in refusal.reason
        )
        allowed = any(r in refusal.reason for r in _ALLOWED_REFUSALS)
        assert array_field_at_2 or one_sample or allowed, refusal
        return None
    assert scan.fields == names
    assert scan.num_samples == len(want)
    for general in (False, True):
        with SpanReader(scan, general=general, **reader_kwargs) as reader:
            # twice: a sample's first read caches its prologue, the second may take the
            # compiled lone-span read (SpanLoader) that needs it
            for i, sample in [*enumerate(want), *enumerate(want)]:
                assert_same(reader.read_sample(i), sample, _path=f"general={general} sample {i}")
            order = list(range(len(want)))[::-1]
            for got, i in zip(reader.read_samples(order), order, strict=True):
                assert_same(got, want[i])
    return scan


@settings(max_examples=70, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=datasets())
def test_every_sample_equals_pickle_load(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]
) -> None:
    path = tmp_path_factory.mktemp("gen") / "f.pkl"
    write(
        path,
        build(data["layout"], data["columns"], data["names"]),
        data["protocol"],
        numpy1=data["numpy1"],
    )
    _check_file(path, data["protocol"])


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_spans_longer_than_a_window(tmp_path: Path, protocol: int) -> None:
    # One sample spans many 64 KiB windows: small opcodes across window edges, text and bytes
    # payloads straddling them, big bytes passed out of band, a big str kept in band.
    sample = [
        list(range(30_000)),
        [f"w{i}" for i in range(5_000)],
        "é" * 50_001,
        b"b" * 70_001,
        bytearray(b"c" * 100_003),
        "s" * 150_000,
        np.arange(40_000, dtype=np.float64),
    ]
    path = tmp_path / "big.pkl"
    path.write_bytes(pickle.dumps(([sample, sample[:3], [1]], [0, 1, 2]), protocol=protocol))
    scan = _check_file(path, protocol)
    assert scan is not None
    start, end = int(scan.starts[0, 0]), int(scan.ends[0, 0])
    raw = path.read_bytes()

    def read_at(offset: int, n: int) -> bytes:
        return raw[offset : offset + n]

    kwargs: dict[str, Any] = {
        "protocol": protocol,
        "memo_base": int(scan.memo_base[0, 0]),
        "shift": 0,
    }
    kwargs["externals"] = scan.externals(0, 0).tolist()
    oob = []
    data, buffers, _ = rewrite_span(
        read_at,
        start,
        end,
        read_payload=lambda o, n, k: oob.append(n) or bytes(raw[o : o + n]),
        **kwargs,
    )
    inband, none, _ = rewrite_span(read_at, start, end, **kwargs)
    assert none == []
    if protocol >= 3:  # at protocol 2 bytes are text; bytearray is a REDUCE there
        assert len(inband) > len(data)
        assert len(buffers) >= 2
        assert min(oob) >= 64 * 1024


def test_python2_pickles_need_an_encoding(tmp_path: Path) -> None:
    # (['a', '\xe9'], [1, 2]) as Python 2 writes it: SHORT_BINSTRING for str
    data = b"\x80\x02]q\x00(U\x01aq\x01U\x01\xe9q\x02e]q\x03(K\x01K\x02e\x86q\x04."
    path = tmp_path / "py2.pkl"
    path.write_bytes(data)
    for encoding in ("latin1", "bytes"):
        scan = scan_file(path, encoding=encoding)
        want = pickle.loads(data, encoding=encoding)
        for general in (False, True):
            with SpanReader(scan, encoding=encoding, general=general) as reader:
                assert reader.read_sample(1) == (want[0][1], want[1][1])
    # without one, the ASCII default fails to decode '\xe9': an error naming the file
    with (
        SpanReader(scan_file(path)) as reader,
        pytest.raises(CorruptPickleError, match="UnicodeDecodeError"),
    ):
        reader.read_sample(1)


def test_array_rows_read_only_their_bytes(tmp_path: Path) -> None:
    big = np.arange(1000 * 256, dtype=np.float32).reshape(1000, 256)
    path = tmp_path / "rows.pkl"
    path.write_bytes(pickle.dumps((big, list(range(1000))), protocol=5))
    scan = scan_file(path)
    with SpanReader(scan) as reader:
        x, y = reader.read_sample(-1)
        assert (x == big[-1]).all()
        assert y == 999
        assert reader.stats.array_rows == 1
        # the int labels are decoded at once, from the bytes that hold only them
        assert reader.stats.int_items == 1000
        y_bytes = int(scan.ends[:, 1].max() - scan.starts[:, 1].min())
        assert y_bytes < 3 * 1000
        assert reader.stats.bytes_read <= 1024 + y_bytes


def test_reader_survives_pickling_and_fork(tmp_path: Path) -> None:
    xs = [{"w": "shared", "a": np.ones(3) * i} for i in range(20)]
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps((xs, list(range(20))), protocol=4))
    reader = SpanReader(scan_file(path))
    first = reader.read_sample(5)
    clone = pickle.loads(pickle.dumps(reader))
    assert_same(clone.read_sample(5), first)
    pid = os.fork()
    if pid == 0:  # the child reads with its own descriptor and cache
        ok = all(reader.read_sample(i)[1] == i for i in range(20))
        os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert_same(reader.read_sample(5), first)


def test_a_file_changed_after_the_scan_raises_a_file_error(tmp_path: Path) -> None:
    path = tmp_path / "f.pkl"
    path.write_bytes(
        pickle.dumps(([list(range(100)) for _ in range(5)], list(range(5))), protocol=5)
    )
    scan = scan_file(path)
    path.write_bytes(path.read_bytes()[: int(scan.starts[3, 0]) + 10])
    for general in (False, True):
        with (
            SpanReader(scan, general=general) as reader,
            pytest.raises(FileChangedError, match=r"it is \d+ bytes, 1052 when indexed") as info,
        ):
            reader.read_sample(4)
        assert str(path) in str(info.value)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_literal_head_stores_each_value_by_value(protocol: int) -> None:
    from pickleshard.picklekit.rewrite import literal_head
    from pickleshard.safety.policy import AllowlistFindClass

    values: list[Any] = ["tokens", 2**100, -1, 0.5, None, True, ("a", 1), np.frombuffer]
    values += [b"raw"] if protocol >= 3 else []
    head = literal_head(protocol, values, None)
    assert head is not None
    gets = b"".join(bytes((0x68, j)) for j in range(len(values)))  # BINGET j
    back = pickle.loads(head + b"(" + gets + b"t.")
    assert back == tuple(values)
    assert [type(v) for v in back] == [type(v) for v in values]
    assert back[values.index(np.frombuffer)] is np.frombuffer
    assert literal_head(protocol, values[:-2], AllowlistFindClass("t.pkl")) is not None
    # Mutable or unencodable values have no literal: the reader keeps persistent ids for them.
    assert literal_head(protocol, [[1, 2]], None) is None
    assert literal_head(protocol, [np.zeros(2)], None) is None
    assert literal_head(protocol, [float("nan")], None) is None  # not equal to itself
    # A global the allowlist refuses is not written into a prologue the allowlist reads.
    assert literal_head(protocol, [os.system], AllowlistFindClass("t.pkl")) is None


def test_rewrite_counts_the_opcodes_that_name_a_global(tmp_path: Path) -> None:
    from fractions import Fraction

    path = tmp_path / "g.pkl"
    path.write_bytes(pickle.dumps(([Fraction(1, 3), 5], [0, 1]), protocol=4))
    scan = scan_file(path)
    raw = path.read_bytes()
    counts = []
    for i in range(2):
        _, _, finds = rewrite_span(
            lambda o, n: raw[o : o + n],
            int(scan.starts[i, 0]),
            int(scan.ends[i, 0]),
            protocol=4,
            memo_base=int(scan.memo_base[i, 0]),
            shift=0,
            externals=scan.externals(i, 0).tolist(),
        )
        counts.append(finds)
    assert counts == [1, 0]  # STACK_GLOBAL fractions.Fraction, then the int 5
    # the allowlist still refuses what the span names, though the plain loads path is taken
    # for spans that name none
    reader = SpanReader(scan)
    assert reader.read_sample(1) == (5, 1)
    from pickleshard.errors import UnsafePickleError

    with pytest.raises(UnsafePickleError, match="Fraction"):
        reader.read_sample(0)


def _loader_calls(reader: SpanReader, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record what the reader's compiled lone-span read answers, call by call."""
    reader.read_sample(0)  # opens the file: the loader exists from then on
    loader, answers = reader._here.get().loader, []
    assert loader is not None

    class Spy:  # records the answers of load (one span) and load_sample (a whole sample)
        def __getattr__(self, name: str) -> Any:
            real = getattr(loader, name)
            if name not in ("load", "load_sample"):
                return real

            def call(*args: Any) -> Any:
                try:
                    got = real(*args)
                except Exception as exc:
                    answers.append(exc)
                    raise
                answers.append(got)
                return got

            return call

    monkeypatch.setattr(reader._here.get(), "loader", Spy())
    return answers


def test_compiled_lone_span_reads_equal_the_python_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fractions import Fraction

    from pickleshard._cscan import SLOW

    xs = [{"tokens": list(range(i)), "text": f"t{i % 3}", "f": Fraction(i, 7)} for i in range(9)]
    xs[4] = {"long": "x" * 70_000}  # longer than one window: read the Python way
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps((xs, list(range(9))), protocol=5))
    scan = scan_file(path)
    pure = SpanReader(scan, engine="python", find_class=None)
    assert pure._here.get().loader is None
    fast = SpanReader(scan, find_class=None)
    answers = _loader_calls(fast, monkeypatch)
    for _ in range(2):
        for i in range(9):
            assert_same(fast.read_sample(i), pure.read_sample(i))
    compiled = [a for a in answers if a is not SLOW]
    assert len(compiled) >= 8  # every sample but the long one, once its prologue is cached
    assert SLOW in answers
    assert any(type(a) is tuple for a in answers)  # whole samples came from load_sample
    before = replace(fast.stats)
    fast.read_sample(2)  # a compiled read counts as one read of the span's bytes
    assert answers[-1] is not SLOW
    assert fast.stats.fast_reads == before.fast_reads + 1
    assert fast.stats.bytes_read == before.bytes_read + int(scan.ends[2, 0] - scan.starts[2, 0])


def test_compiled_lone_span_reads_meet_the_allowlist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fractions import Fraction

    from pickleshard._cscan import SLOW
    from pickleshard.errors import UnsafePickleError

    path = tmp_path / "g.pkl"
    path.write_bytes(pickle.dumps(([1, 2, Fraction(1, 3)], [0, 1, 2]), protocol=4))
    reader = SpanReader(scan_file(path))
    answers = _loader_calls(reader, monkeypatch)
    assert reader.read_sample(1) == (2, 1)
    with pytest.raises(UnsafePickleError, match="Fraction") as info:
        reader.read_sample(2)
    assert info.value.sample == 2
    assert answers[0] is not SLOW
    assert isinstance(answers[1], UnsafePickleError)  # refused inside the compiled read


def test_compiled_lone_span_reads_name_damaged_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f.pkl"
    xs = [{"a": list(range(10)), "b": "text"} for _ in range(6)]
    path.write_bytes(pickle.dumps((xs, list(range(6))), protocol=5))
    scan = scan_file(path)
    reader = SpanReader(scan)
    for i in range(6):
        reader.read_sample(i)
    assert reader._here.get().loader is not None
    start, end = int(scan.starts[3, 0]), int(scan.ends[3, 0])
    raw = bytearray(path.read_bytes())
    raw[start : end - 1] = b"\xff" * (end - 1 - start)  # same size: unknown opcodes
    write_keeping_times(path, bytes(raw))
    with pytest.raises(CorruptPickleError) as info:
        reader.read_sample(3)
    assert str(path) in str(info.value)
    assert info.value.offset == start


def _twin_readers(path: Path, n: int) -> tuple[ScanResult, dict[str, SpanReader]]:
    """The pure and the compiled reader of ``path``, each having read every sample twice (the
    compiled one then reads whole samples in one call)."""
    scan = scan_file(path)
    readers = {e: SpanReader(scan, engine=e) for e in ("python", "compiled")}
    for r in readers.values():
        for i in [*range(n), *range(n)]:
            r.read_sample(i)
    return scan, readers


@pytest.mark.parametrize("order", ["xyz", "zyx"])
@pytest.mark.parametrize("damage", ["cut span", "cut array", "overwrite span"])
def test_compiled_reads_that_fail_count_and_raise_as_the_python_path(
    tmp_path: Path, order: str, damage: str
) -> None:
    n = 12
    cols = {
        "x": [np.full((3, 4), i, np.float32) for i in range(n)],
        "y": list(range(n)),
        "z": [{"k": [i] * 3} for i in range(n)],
    }
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps({k: cols[k] for k in order}, protocol=5))
    scan, readers = _twin_readers(path, n)
    x, z = order.index("x"), order.index("z")
    raw = bytearray(path.read_bytes())
    if damage == "cut span":
        raw = raw[: int(scan.starts[7, z]) + 3]
    elif damage == "cut array":
        raw = raw[: int(scan.starts[7, x]) + 20]
    else:
        s, e = int(scan.starts[7, z]), int(scan.ends[7, z])
        raw[s : e - 1] = b"\xff" * (e - 1 - s)
    write_keeping_times(path, bytes(raw))
    outcomes = []
    for r in readers.values():
        before = replace(r.stats)
        with pytest.raises(CorruptPickleError) as info:
            r.read_sample(7)
        after = vars(r.stats)
        counted = {k: v - vars(before)[k] for k, v in after.items() if v != vars(before)[k]}
        outcomes.append((type(info.value), info.value.offset, str(info.value), counted))
    assert outcomes[0] == outcomes[1]


def test_a_payload_past_its_span_end_is_named_alike_by_every_path(tmp_path: Path) -> None:
    path = tmp_path / "f.pkl"
    xs = [{"tokens": list(range(i % 5 + 3)), "text": f"t{i % 3}"} for i in range(8)]
    path.write_bytes(pickle.dumps((xs, list(range(8))), protocol=5))
    scan, readers = _twin_readers(path, 8)
    raw = bytearray(path.read_bytes())
    i = raw.index(b"K", int(scan.starts[3, 0]))  # a BININT1 inside sample 3's span
    raw[i : i + 5] = b"B" + (100_000).to_bytes(4, "little")  # now a BINBYTES of 100 kB
    path.write_bytes(bytes(raw))  # the same size: only the bytes can say what is wrong
    messages = set()
    for r in readers.values():
        with pytest.raises(TruncatedPickleError, match="runs past the span end") as info:
            r.read_sample(3)
        messages.add((info.value.offset, str(info.value)))
    assert len(messages) == 1
    path.write_bytes(bytes(raw) + bytes(300_000))  # the file grew: it changed since its scan
    messages = set()
    for r in readers.values():
        with pytest.raises(FileChangedError, match="it is 300260 bytes, 260 when indexed") as info:
            r.read_sample(3)
        messages.add((info.value.offset, str(info.value)))
    assert len(messages) == 1


def test_sample_indices_out_of_range_raise_index_error_on_every_path(tmp_path: Path) -> None:
    path = tmp_path / "f.pkl"
    obj = {"x": [np.full((3, 4), i, np.float32) for i in range(6)], "y": list(range(6))}
    path.write_bytes(pickle.dumps(obj, protocol=5))
    _, readers = _twin_readers(path, 6)
    for r in readers.values():
        for bad in (6, -7, 2**63, -(2**63) - 1, 2**70):
            with pytest.raises(IndexError, match="out of range"):
                r.read_sample(bad)
        assert r.read_sample(-1)[1] == 5


def test_batch_reads_name_the_label_of_a_refused_sample_read_whole(tmp_path: Path) -> None:
    from fractions import Fraction

    from pickleshard.errors import UnsafePickleError

    n = 8
    obj = {
        "x": [np.ones((2, 2), np.float32) * i for i in range(n)],
        "y": list(range(n)),
        "z": [Fraction(i, 3) for i in range(n)],
    }
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps(obj, protocol=4))
    for engine in ("python", "compiled"):
        reader = SpanReader(scan_file(path), engine=engine)
        for i in (0, 1):  # sample 0 of an array field is read whole (the template follows it)
            with pytest.raises(UnsafePickleError) as info:
                reader.read_samples([i], labels=[100 + i])
            assert info.value.sample == 100 + i


def test_compiled_batch_reads_name_the_label_of_a_refused_sample(tmp_path: Path) -> None:
    from fractions import Fraction

    from pickleshard.errors import UnsafePickleError

    path = tmp_path / "f.pkl"
    xs = [{"k": Fraction(i, 3)} if i in (4, 6) else {"k": i} for i in range(8)]
    path.write_bytes(pickle.dumps((xs, list(range(8))), protocol=4))
    reader = SpanReader(scan_file(path))
    reader.read_sample(1)
    assert reader.plan is not None
    assert reader.plan.compiled
    assert [s[1] for s in reader.read_samples([5, 3, 7], labels=[50, 30, 70])] == [5, 3, 7]
    with pytest.raises(UnsafePickleError) as info:
        reader.read_samples([3, 4, 5], labels=[30, 40, 50])
    assert info.value.sample == 40


def test_the_sample_label_is_an_argument_never_state_on_the_lookup(tmp_path: Path) -> None:
    """A refusal names the label of the read that met it, by every path (compiled one by one
    and in a batch, Python), and the allowlist lookup the readers share is never written: a
    read in one reader cannot relabel a refusal in another."""
    from fractions import Fraction

    from pickleshard.errors import UnsafePickleError
    from pickleshard.safety.policy import AllowlistFindClass

    path = tmp_path / "f.pkl"
    xs = [{"k": Fraction(i, 3)} if i in (4, 6) else {"k": i} for i in range(8)]
    path.write_bytes(pickle.dumps((xs, list(range(8))), protocol=4))
    lookup = AllowlistFindClass(str(path))
    scan = scan_file(path)
    readers = [SpanReader(scan, find_class=lookup, engine=e) for e in ("compiled", "python")]
    for r in readers:
        assert r.read_sample(1)[1] == 1
    for r in readers:
        for read, want in (
            (lambda r=r: r.read_samples([4], labels=[400]), 400),
            (lambda r=r: r.read_samples([3, 5, 6], labels=[30, 50, 60]), 60),
            (lambda r=r: r.many([4], [41]), 41),
            (lambda r=r: r.read_sample(6), 6),
        ):
            with pytest.raises(UnsafePickleError) as info:
                read()
            assert info.value.sample == want
            assert f"(sample {want})" in str(info.value)
            assert lookup.sample is None


def test_read_samples_takes_any_integer_indices(tmp_path: Path) -> None:
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps(([{"a": i} for i in range(6)], list(range(6))), protocol=5))
    reader = SpanReader(scan_file(path))
    reader.read_sample(0)  # planned: the compiled path from here
    labels = [s[1] for s in reader.read_samples([1, np.int64(2), -1, 2.0])]  # type: ignore[list-item]
    assert labels == [1, 2, 5, 2]
    assert [s[1] for s in reader.read_samples(np.array([[4], [0]]))] == [4, 0]
    assert [s[1] for s in reader.read_samples(3)] == [3]  # type: ignore[arg-type]


def _same_array(got: Any, want: np.ndarray) -> None:
    assert type(got) is np.ndarray
    assert got.dtype == want.dtype
    assert got.dtype.byteorder == want.dtype.byteorder
    assert got.shape == want.shape
    assert got.flags.writeable == want.flags.writeable
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("protocol", [3, 4, 5])
@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<i8", "u1"])
def test_per_sample_arrays_are_read_from_their_payloads(
    tmp_path: Path, protocol: int, dtype: str
) -> None:
    from pickleshard.scan import ArrayItem, IntItem

    rng = np.random.default_rng(protocol)
    xs = [(rng.random((3, 16, 16)) * 100).astype(dtype) for _ in range(1500)]
    xs[700] = xs[700].reshape(16, 3, 16)  # another shape: read by span, not from the payload
    xs[900] = np.asfortranarray(xs[900][0])  # Fortran order: by span
    ys = [int(v) for v in rng.integers(-70_000, 70_000, size=len(xs))]
    path = tmp_path / "seed.pkl"
    path.write_bytes(pickle.dumps((xs, ys), protocol=protocol))
    scan = scan_file(path)
    item = scan.items[0]
    assert isinstance(item, ArrayItem)
    assert isinstance(scan.items[1], IntItem)
    assert {0, 700, 900} <= set(item.exceptions)
    assert len(item.exceptions) < 60  # early short BINPUT ids at protocol 3; FRAMEs are fine
    with open(path, "rb") as fh:
        want_x, want_y = pickle.load(fh)
    with SpanReader(scan) as reader:
        for i in range(len(xs)):
            x, y = reader.read_sample(i)
            _same_array(x, want_x[i])
            assert type(y) is int
            assert y == want_y[i]
        assert reader.stats.array_items == len(xs) - len(item.exceptions)


def test_read_only_arrays_stay_read_only(tmp_path: Path) -> None:
    xs = [np.arange(i, i + 64, dtype=np.float32) for i in range(300)]
    for x in xs:
        x.flags.writeable = False  # protocol 5 pickles them as BINBYTES: they load read-only
    path = tmp_path / "ro.pkl"
    path.write_bytes(pickle.dumps((xs, list(range(300))), protocol=5))
    scan = scan_file(path)
    with open(path, "rb") as fh:
        want, _ = pickle.load(fh)
    assert scan.items[0] is not None
    assert scan.items[0].readonly
    with SpanReader(scan) as reader:
        for i in (1, 150, 299):
            _same_array(reader.read_sample(i)[0], want[i])


@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 0, 3), (4, 4)], ids=str)
@pytest.mark.parametrize("protocol", [3, 5])
def test_array_items_of_every_shape_read_one_by_one_and_in_batches(
    tmp_path: Path, shape: tuple[int, ...], protocol: int
) -> None:
    from pickleshard.scan import ArrayItem

    xs = [np.full(shape, i, dtype=np.int16) for i in range(40)]
    path = tmp_path / "s.pkl"
    path.write_bytes(pickle.dumps((xs, [float(i) for i in range(40)]), protocol=protocol))
    scan = scan_file(path)
    if np.prod(shape) or protocol >= 5:  # protocol 3 pickles every empty array's b"" as one GET
        assert isinstance(scan.items[0], ArrayItem)
    with open(path, "rb") as fh:
        want, want_y = pickle.load(fh)
    order = [7, 0, 39, 12, 12, 3]
    with SpanReader(scan) as reader:
        batch = reader.read_samples(order)
        for (x, y), i in zip(batch, order, strict=True):
            _same_array(x, want[i])
            assert y == want_y[i]
        for i in order:
            _same_array(reader.read_sample(i)[0], want[i])


def test_batch_reads_keep_read_only_arrays_read_only(tmp_path: Path) -> None:
    n = BATCH_READ_MIN + 4
    xs = [np.arange(i, i + 8, dtype=np.float64) for i in range(n)]
    for x in xs:
        x.flags.writeable = False
    path = tmp_path / "ro.pkl"
    path.write_bytes(pickle.dumps((xs, list(range(n))), protocol=5))
    with open(path, "rb") as fh:
        want, _ = pickle.load(fh)
    # enough samples for the batch read, out of offset order; not sample 0, whose span also
    # defines the globals every later array refers to (read alone, by read_sample)
    order = list(range(n - 1, n - 1 - BATCH_READ_MIN, -1))
    with SpanReader(scan_file(path)) as reader:
        got = reader.read_samples(order)
        for (x, _), i in zip(got, order, strict=True):
            _same_array(x, want[i])
        # the batch path ran: every array is a row of one (len(order), 8) array read from the
        # payloads, which the one-by-one path never builds
        assert reader.stats.array_items == len(order)
        rows = got[0][0].base
        assert rows is not None
        assert rows.shape == (len(order), 8)
        assert all(x.base is rows for x, _ in got)
        assert not rows.flags.writeable


def test_a_value_two_fields_share_stays_one_object(tmp_path: Path) -> None:
    s, t = "hello world" * 3, (1, 2, "x")
    path = tmp_path / "shared.pkl"
    path.write_bytes(pickle.dumps([(s, t, 0)] + [(s, s, i) for i in range(1, 6)], protocol=4))
    with open(path, "rb") as fh:
        want = pickle.load(fh)
    assert want[1][0] is want[1][1]
    with SpanReader(scan_file(path)) as reader:
        for got in (reader.read_sample(1), reader.read_samples([1, 2])[0]):
            assert got[0] == s
            assert got[0] is got[1]


def test_big_shared_values_are_not_copied_into_prologues(tmp_path: Path) -> None:
    big = b"\x01" * (1 << 20)
    path = tmp_path / "big.pkl"
    path.write_bytes(
        pickle.dumps([((big, "a"), 0)] + [((big, str(i)), i) for i in range(1, 50)], 4)
    )
    with SpanReader(scan_file(path)) as reader:
        for i in range(1, 50):
            assert reader.read_sample(i)[0][0] == big
        assert sum(len(h) for h in reader.spans.heads.values() if h) < 64 * 1024


def test_cached_extension_codes_still_meet_the_allowlist(tmp_path: Path) -> None:
    import copyreg
    from fractions import Fraction

    from pickleshard.errors import UnsafePickleError

    copyreg.add_extension("fractions", "Fraction", 240)
    try:
        path = tmp_path / "ext.pkl"
        path.write_bytes(pickle.dumps([(Fraction(i + 1, 3), i) for i in range(10)], protocol=3))
        pickle.loads(pickle.dumps(Fraction(1, 2), protocol=2))  # primes copyreg's cache
        with SpanReader(scan_file(path)) as reader, pytest.raises(UnsafePickleError):
            reader.read_sample(1)
        from pickleshard.read.whole.load import load_file

        pickle.loads(pickle.dumps(Fraction(1, 2), protocol=2))
        with pytest.raises(UnsafePickleError):
            load_file(path)
    finally:
        copyreg.remove_extension("fractions", "Fraction", 240)


@pytest.mark.parametrize("n", [768, 6250, 150_000], ids=["6KB", "50KB", "1.2MB"])
def test_array_items_for_samples_around_the_frame_size(tmp_path: Path, n: int) -> None:
    from pickleshard.scan import ArrayItem

    xs = [np.full(n, i, dtype=np.float64) for i in range(60)]
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps((xs, list(range(60))), protocol=5))
    scan = scan_file(path)
    item = scan.items[0]
    assert isinstance(item, ArrayItem)
    assert len(item.exceptions) <= 2  # sample 0, and at most one with a FRAME where none other has
    with SpanReader(scan) as reader:
        for i in (1, 2, 30, 59):
            _same_array(reader.read_sample(i)[0], xs[i])
