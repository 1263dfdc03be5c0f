"""Files changed under a valid index while they are read (issue 12, item 1): every sample a read
returns is the old or the new ``pickle.load`` value, else the read raises
:class:`~pickleshard.errors.FileChangedError` (a ``StaleIndexError``) naming the file."""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from pickleshard import PickleDataset
from pickleshard.errors import (
    CorruptPickleError,
    FileChangedError,
    ReadMemoryError,
    StaleIndexError,
    UnreadableFileError,
)
from pickleshard.io.identity import FileIdentity
from pickleshard.read import SpanReader
from pickleshard.scan import ArrayItem, scan_file
from pickleshard.testing import same
from rewrites import write_keeping_times

SHAPE = (3, 32, 32)  # float32: 12 KB samples, as in the issue
N = 96
ENGINES = ["python", "compiled"]


def _xs(n: int, base: float) -> list[np.ndarray]:
    grid = np.arange(int(np.prod(SHAPE)), dtype=np.float32).reshape(SHAPE)
    return [grid + np.float32(base + 10_000 * i) for i in range(n)]


def _pickles(protocol: int = 5, n: int = N) -> tuple[bytes, bytes]:
    """The old and the new content of one file: the same shapes, new values (the same size but
    at protocol 2, whose arrays are text)."""
    old = pickle.dumps((_xs(n, 0.0), list(range(n))), protocol)
    new = pickle.dumps((_xs(n, 0.5), list(range(n))), protocol)
    assert protocol == 2 or len(old) == len(new)
    return old, new


def _dataset_file(tmp_path: Path, protocol: int = 5) -> tuple[Path, bytes, bytes]:
    old, new = _pickles(protocol)
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "arrays.pkl"
    path.write_bytes(old)
    return path, old, new


class Tally:
    """Samples returned old, new or torn (neither), and errors, by the file they name."""

    def __init__(self, old: bytes, new: bytes, path: Path) -> None:
        xs_old, ys_old = pickle.loads(old)
        xs_new, ys_new = pickle.loads(new)
        self.old = list(zip(xs_old, ys_old, strict=True))
        self.new = list(zip(xs_new, ys_new, strict=True))
        self.path = path
        self.counts = {"old": 0, "new": 0, "torn": 0, "errors": 0}

    def sample(self, i: int, got: tuple[Any, ...]) -> None:
        kind = "old" if same(got, self.old[i]) else "new" if same(got, self.new[i]) else "torn"
        self.counts[kind] += 1

    def error(self, exc: BaseException) -> None:
        assert isinstance(exc, StaleIndexError), repr(exc)
        assert self.path.name in str(exc)
        self.counts["errors"] += 1


def _torn_rewrite(path: Path, new: bytes, sample: int, keep_mtime: bool) -> None:
    """Write the new content over the old in place up to the middle of ``sample``'s payload
    (the file then holds a sample that is half old, half new), maybe restoring the mtime."""
    scan = scan_file(path)
    spec = scan.items[0]
    assert isinstance(spec, ArrayItem)
    cut = int(scan.starts[sample, 0]) + spec.prefix + 6000
    st = os.stat(path)
    fd = os.open(path, os.O_WRONLY)
    try:
        assert os.pwrite(fd, new[:cut], 0) == cut
    finally:
        os.close(fd)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(path).st_mtime_ns == st.st_mtime_ns


def _order() -> list[int]:
    return np.random.default_rng(12).permutation(N).tolist()


def _item_epoch(
    ds: PickleDataset, tally: Tally, order: list[int], rewrite: Callable[[], None]
) -> None:
    for k, i in enumerate(order):
        if k == N // 3:
            rewrite()
        try:
            tally.sample(i, ds[i])
        except StaleIndexError as exc:
            tally.error(exc)


def _batch_epoch(
    ds: PickleDataset, tally: Tally, order: list[int], rewrite: Callable[[], None]
) -> None:
    for k in range(0, N, 16):
        if k == 32:
            rewrite()
        batch = order[k : k + 16]
        try:
            got = ds.__getitems__(batch)
        except StaleIndexError as exc:
            tally.error(exc)
            continue
        for i, sample in zip(batch, got, strict=True):
            tally.sample(i, sample)


def _loader_epoch(
    ds: PickleDataset, tally: Tally, order: list[int], rewrite: Callable[[], None], workers: int
) -> None:
    loader = DataLoader(
        ds, batch_size=8, sampler=order, num_workers=workers, collate_fn=lambda b: b
    )
    it: Iterator[list[tuple[Any, ...]]] = iter(loader)
    try:
        for k, batch in enumerate(it):
            if k == 2:
                rewrite()
            for sample in batch:
                tally.sample(int(sample[1]), sample)  # y is the sample's index, old and new
    except StaleIndexError as exc:  # the loader stops at the first error
        tally.error(exc)


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["mtime-moves", "mtime-restored"])
@pytest.mark.parametrize("entry", ["item", "getitems", "loader0", "loader2"])
def test_a_file_rewritten_during_an_epoch_gives_old_or_new_samples_or_an_error(
    tmp_path: Path, entry: str, keep_mtime: bool
) -> None:
    path, old, new = _dataset_file(tmp_path)
    ds = PickleDataset(tmp_path / "data", mode="span")
    assert ds[0][0].shape == SHAPE  # the readers of this process are open and planned
    order = _order()
    tally = Tally(old, new, path)
    torn_at = order[N // 3 + 5]  # a sample the epoch reads after the rewrite

    def rewrite() -> None:
        _torn_rewrite(path, new, torn_at, keep_mtime)

    if entry == "item":
        _item_epoch(ds, tally, order, rewrite)
    elif entry == "getitems":
        _batch_epoch(ds, tally, order, rewrite)
    else:
        _loader_epoch(ds, tally, order, rewrite, workers=int(entry[-1]))
    assert tally.counts["torn"] == 0, tally.counts
    assert tally.counts["errors"] >= 1, tally.counts  # reads after the rewrite were refused
    assert tally.counts["old"] >= 16, tally.counts


def test_without_the_checks_the_same_rewrite_returns_torn_samples(tmp_path: Path) -> None:
    """The control for the test above: it can fail (the reads it guards are real)."""
    path, old, new = _dataset_file(tmp_path)
    ds = PickleDataset(tmp_path / "data", mode="span")
    ds.span_files.verify = False
    order = _order()
    tally = Tally(old, new, path)
    torn_at = order[N // 3 + 5]
    _item_epoch(ds, tally, order, lambda: _torn_rewrite(path, new, torn_at, keep_mtime=True))
    assert tally.counts["torn"] == 1, tally.counts
    assert tally.counts["errors"] == 0, tally.counts


def test_a_write_racing_a_read_is_caught_by_the_check_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer lands in the middle of one read (the Python path's ``preadv``, which a test can
    interpose on): the framing read is intact; only the identity check after the read (not one
    before it) catches the change."""
    path, old, new = _dataset_file(tmp_path)
    scan = scan_file(path)
    st = os.stat(path)
    identity = FileIdentity(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    real = os.preadv

    def racing(fd: int, buffers: list[Any], offset: int) -> int:
        got = real(fd, buffers[:2], offset)  # head and payload (the old bytes) ...
        path.write_bytes(new)  # ... a writer rewrites the file in place ...
        return got + real(fd, buffers[2:], offset + got)  # ... then the tail

    tally = Tally(old, new, path)
    control = SpanReader(scan, engine="python", identity=identity, verify=False)
    assert control.read_sample(3)[0].shape == SHAPE
    monkeypatch.setattr(os, "preadv", racing)
    tally.sample(7, control.read_sample(7))  # the control: the payload read before the write
    monkeypatch.setattr(os, "preadv", real)
    path.write_bytes(old)  # the file as indexed again (its ctime has moved: index it so)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    identity = FileIdentity(st.st_size, st.st_mtime_ns, os.stat(path).st_ctime_ns, st.st_ino)
    reader = SpanReader(scan, engine="python", identity=identity)
    assert reader.read_sample(3)[0].shape == SHAPE  # the file is the one indexed
    monkeypatch.setattr(os, "preadv", racing)
    with pytest.raises(FileChangedError, match="mtime") as info:
        reader.read_sample(7)
    tally.error(info.value)
    assert info.value.sample == 7
    assert tally.counts == {"old": 1, "new": 0, "torn": 0, "errors": 1}


# -- (b) framing: bytes around a payload edited with size and mtime kept ------------------------


def _edit_shape(path: Path, sample: int) -> int:
    """Turn sample ``sample``'s shape (3, 32, 32) into (3, 64, 16) in place, keeping the size
    and the mtime; return its span's start."""
    scan = scan_file(path)
    start, end = int(scan.starts[sample, 0]), int(scan.ends[sample, 0])
    raw = bytearray(path.read_bytes())
    at = raw.index(b"K\x03K K ", start, end)
    raw[at : at + 6] = b"K\x03K@K\x10"
    write_keeping_times(path, bytes(raw))
    return start


@pytest.mark.parametrize("protocol", [3, 4, 5])
@pytest.mark.parametrize("engine", ENGINES)
def test_shape_bytes_edited_with_size_and_times_kept_raise_not_reshape(
    tmp_path: Path, engine: str, protocol: int
) -> None:
    """The framing check alone (an identity of the size only, as on a file system whose times do
    not move): a sample whose shape bytes changed is refused, by one read and by a batch."""
    path, old, _ = _dataset_file(tmp_path, protocol)
    scan = scan_file(path)
    spec = scan.items[0]
    assert isinstance(spec, ArrayItem)
    direct = [i for i in range(N) if i not in spec.exceptions]  # read from their payloads
    reader = SpanReader(scan, engine=engine, identity=FileIdentity(scan.size))
    for i in direct[:4]:  # settles the fields (and gives the compiled reader its plan)
        reader.read_sample(i)
    assert reader.stats.array_items > 0
    k = direct[-3]
    start = _edit_shape(path, k)
    with pytest.raises(FileChangedError) as info:
        reader.read_sample(k)
    assert (info.value.path, info.value.offset, info.value.sample) == (str(path), start, k)
    assert "dtype, shape" in str(info.value)
    assert isinstance(info.value, StaleIndexError)
    assert isinstance(info.value, CorruptPickleError)
    with pytest.raises(FileChangedError, match=rf"\(sample {k}\)"):
        reader.read_samples(direct[-20:])
    xs, ys = pickle.loads(old)
    assert same(reader.read_sample(direct[-2]), (xs[direct[-2]], ys[direct[-2]]))


def test_shape_bytes_edited_under_a_dataset_raise_stale(tmp_path: Path) -> None:
    path, old, _ = _dataset_file(tmp_path)
    ds = PickleDataset(tmp_path / "data", mode="span")
    assert same(ds[3], tuple(v[3] for v in pickle.loads(old)))
    _edit_shape(path, 9)
    for read in (lambda: ds[9], lambda: ds[10], lambda: ds.__getitems__(list(range(20)))):
        with pytest.raises(StaleIndexError, match=r"arrays\.pkl"):
            read()


def test_a_span_that_does_not_fit_the_framing_is_refused(tmp_path: Path) -> None:
    path, _, _ = _dataset_file(tmp_path)
    scan = scan_file(path)
    ends = scan.ends.copy()
    ends[9, 0] += 40  # an index whose span is longer than any framing of the template
    for engine in ENGINES:
        reader = SpanReader(replace(scan, ends=ends), engine=engine)
        for i in range(4):
            reader.read_sample(i)
        with pytest.raises(FileChangedError, match="does not fit"):
            reader.read_sample(9)


def test_a_changed_small_int_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ints.pkl"
    path.write_bytes(pickle.dumps(([b"x" * i for i in range(8)], list(range(8))), 5))
    scan = scan_file(path)
    raw = bytearray(path.read_bytes())
    at = int(scan.starts[5, 1])
    assert raw[at] == 0x4B  # BININT1
    raw[at] = 0x68  # BINGET: the same size, not an int
    write_keeping_times(path, bytes(raw))
    with pytest.raises(FileChangedError, match="small int"):
        SpanReader(scan, identity=FileIdentity(scan.size)).read_sample(5)


def test_an_identity_that_no_longer_holds_is_refused_on_open(tmp_path: Path) -> None:
    path, _, _ = _dataset_file(tmp_path)
    scan = scan_file(path)
    st = os.stat(path)
    moved = FileIdentity(st.st_size, st.st_mtime_ns - 1, None, st.st_ino)
    with pytest.raises(FileChangedError, match="mtime") as info:
        SpanReader(scan, identity=moved).read_sample(0)
    assert info.value.path == str(path)
    other = FileIdentity(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino + 1)
    with pytest.raises(FileChangedError, match="inode"):
        SpanReader(scan, identity=other).read_sample(0)


def test_the_lru_reopen_checks_the_identity(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    old, new = _pickles(n=8)
    for name in ("a.pkl", "b.pkl"):
        (tmp_path / "data" / name).write_bytes(old)
    ds = PickleDataset(tmp_path / "data", mode="span")
    ds.span_files.max_open = 1
    ds[0], ds[8]  # a.pkl's reader is closed to open b.pkl's
    assert ds.span_files.stats.loads == 2
    path = tmp_path / "data" / "a.pkl"
    st = path.stat()
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(StaleIndexError, match=r"a\.pkl: its ctime"):
        ds[1]


# -- (c) both engines and every path agree with pickle.load ----------------------------------


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_checked_reads_equal_pickle_load_on_every_path(tmp_path: Path, protocol: int) -> None:
    path, old, _ = _dataset_file(tmp_path, protocol)
    want = list(zip(*pickle.loads(old), strict=True))
    scan = scan_file(path)
    if protocol >= 3:  # masked memo ids (3) and FRAME headers after payloads (4, 5) are read
        spec = scan.items[0]
        assert isinstance(spec, ArrayItem)
        assert len(spec.exceptions) < N // 2
        lengths = scan.ends[:, 0] - scan.starts[:, 0]
        assert bool(spec.head_masked) == (protocol == 3)
        assert protocol == 3 or (lengths == len(spec.head) + 12288 + len(spec.tail) + 9).any()
    order = _order()
    for engine in ENGINES:
        reader = SpanReader(scan, engine=engine)
        for _ in range(2):  # the second time through the compiled plan, if any
            for i in order:
                assert same(reader.read_sample(i), want[i])
        assert all(same(g, want[i]) for i, g in zip(order, reader.read_samples(order), strict=True))
        assert all(
            same(g, want[i]) for i, g in zip(order[:9], reader.read_samples(order[:9]), strict=True)
        )
    ds = PickleDataset(tmp_path / "data", mode="span")
    assert all(same(ds[i], want[i]) for i in order)
    assert all(same(g, want[i]) for i, g in zip(order, ds.__getitems__(order), strict=True))


def test_the_framing_template_survives_the_index(tmp_path: Path) -> None:
    path, _, _ = _dataset_file(tmp_path, 3)
    spec = scan_file(path).items[0]
    assert isinstance(spec, ArrayItem)
    assert ArrayItem.from_json(spec.to_json()) == spec
    bad = {**spec.to_json(), "head_masked": [[0, 999]]}
    with pytest.raises(ValueError, match="framing"):
        ArrayItem.from_json(bad)


# -- messages that say what happened -----------------------------------------------------------


def test_a_memory_error_in_a_span_read_is_not_called_a_changed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "objs.pkl"
    path.write_bytes(pickle.dumps(([{"k": [i] * 3} for i in range(6)], list(range(6))), 5))
    scan = scan_file(path)

    def no_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(pickle, "loads", no_memory)
    monkeypatch.setattr(pickle, "Unpickler", no_memory)
    for engine in ENGINES:
        with pytest.raises(ReadMemoryError) as info:
            SpanReader(scan, engine=engine).read_sample(3)
        assert isinstance(info.value, MemoryError)
        assert "changed" not in str(info.value)
        assert str(path) in str(info.value)
        assert "out of memory" in str(info.value)


def test_both_engines_refuse_an_edited_framing_alike(tmp_path: Path) -> None:
    """The twins: the same error (class, offset, sample, message) and the same counters."""
    path, _, _ = _dataset_file(tmp_path)
    scan = scan_file(path)
    readers = {e: SpanReader(scan, engine=e, identity=FileIdentity(scan.size)) for e in ENGINES}
    for r in readers.values():
        for i in [*range(20, 30), *range(20, 30)]:  # the compiled one then reads by its plan
            r.read_sample(i)
    assert readers["compiled"].plan is not None
    assert readers["compiled"].plan.compiled
    _edit_shape(path, 40)
    outcomes = []
    for r in readers.values():
        for read in (lambda r=r: r.read_sample(40), lambda r=r: r.read_samples(range(30, 50))):
            before = vars(replace(r.stats))
            with pytest.raises(FileChangedError) as info:
                read()
            counted = {k: v - before[k] for k, v in vars(r.stats).items() if v != before[k]}
            err = info.value
            outcomes.append((type(err), err.offset, err.sample, str(err), counted))
    assert outcomes[:2] == outcomes[2:]


def test_a_writer_racing_an_epoch_never_yields_a_torn_sample(tmp_path: Path) -> None:
    """A real writer thread rewrites the file in 4 KiB pieces (putting the mtime back after
    each) while an epoch reads it: every sample is old or new, or the read is refused."""
    path, old, new = _dataset_file(tmp_path)
    ds = PickleDataset(tmp_path / "data", mode="span")
    tally = Tally(old, new, path)
    order = _order()
    st = os.stat(path)
    done = threading.Event()

    def writer() -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            for at in range(0, len(new), 4096):
                os.pwrite(fd, new[at : at + 4096], at)
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fd)
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while not done.is_set():
            for k in range(0, N, 8):
                try:
                    got = ds.__getitems__(order[k : k + 8]) if k % 16 else [ds[order[k]]]
                except StaleIndexError as exc:
                    tally.error(exc)
                    continue
                for i, sample in zip(order[k : k + 8], got, strict=False):
                    tally.sample(i, sample)
    finally:
        thread.join()
    with pytest.raises(StaleIndexError):  # once the writer is done, every read is refused
        ds[0]
    assert tally.counts["torn"] == 0, tally.counts


def test_a_file_refused_on_open_is_refused_again(tmp_path: Path) -> None:
    path, _, _ = _dataset_file(tmp_path)
    scan = scan_file(path)
    st = os.stat(path)
    reader = SpanReader(scan, identity=FileIdentity(st.st_size, st.st_mtime_ns - 1))
    for _ in range(2):
        with pytest.raises(FileChangedError, match="mtime"):
            reader.read_sample(0)
    assert not reader.source._file.opened  # not left open


def test_whole_mode_refuses_a_file_rewritten_after_it_was_indexed(tmp_path: Path) -> None:
    """Whole mode loads the file at its first sample: new content with the same size and mtime
    (ctime moved) is refused by name, not decoded as if the index still held."""
    path, _old, new = _dataset_file(tmp_path)
    ds = PickleDataset(path.parent, mode="whole")
    write_keeping_times(path, new)
    with pytest.raises(FileChangedError, match="changed since it was indexed") as info:
        ds[0]
    assert str(path) in str(info.value)
    assert str(info.value).count("changed since it was indexed") == 1  # said once, not twice


def test_whole_mode_refuses_a_file_written_while_it_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that lands while the whole file is being unpickled (here: half of it, between
    the open and the load) gives FileChangedError after the load, never a mixed file."""
    import pickleshard.read.whole.load as wholefile

    path, old, new = _dataset_file(tmp_path)
    ds = PickleDataset(path.parent, mode="whole")
    real = wholefile._load_one

    def torn(fh: Any, where: str, size: int, policy: Any) -> Any:
        with open(where, "r+b") as out:  # the second half of the file becomes the new one's
            out.seek(len(old) // 2)
            out.write(new[len(old) // 2 :])
        return real(fh, where, size, policy)

    monkeypatch.setattr(wholefile, "_load_one", torn)
    with pytest.raises(FileChangedError, match="while it was read") as info:
        ds[0]
    assert str(path) in str(info.value)


@pytest.mark.parametrize("call", ["pread", "preadv", "fstat"])
def test_an_io_error_in_a_span_read_is_an_unreadable_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """EIO or ESTALE (a file replaced on NFS) from a read or an fstat: UnreadableFileError
    naming the file, not a bare OSError nor a span "that does not unpickle"."""
    import errno

    path = tmp_path / "mixed.pkl"
    path.write_bytes(pickle.dumps([({"a": i}, np.zeros(3) + i) for i in range(20)], 5))
    ds = PickleDataset(tmp_path, mode="span")
    ds[0]  # opened and checked before the errors start

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    reads: list[Callable[[], Any]] = [lambda: ds[3]]
    if call != "fstat":  # batches check identity in the compiled loader
        reads.append(lambda: ds.__getitems__([1, 2, 5]))
    for read in reads:
        monkeypatch.setattr(os, call, failing)
        with pytest.raises(UnreadableFileError, match="Input/output error") as info:
            read()
        monkeypatch.undo()
        assert str(path) in str(info.value)
        assert not isinstance(info.value, CorruptPickleError)


def test_an_io_error_in_a_whole_load_is_an_unreadable_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that fails inside the whole-file unpickler (EIO): UnreadableFileError naming
    the file, not a corrupt pickle."""
    import errno

    path = tmp_path / "mixed.pkl"
    path.write_bytes(pickle.dumps([({"a": i}, np.zeros(3) + i) for i in range(20)], 5))
    ds = PickleDataset(tmp_path, mode="whole")

    def failing(*args: Any) -> Any:  # the unpickler's reads (preadv), not the head's (pread)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "preadv", failing)
    with pytest.raises(UnreadableFileError, match="Input/output error") as info:
        ds[0]
    assert str(path) in str(info.value)
    assert not isinstance(info.value, CorruptPickleError)
