"""PickleDataset reading samples by span: every layout and protocol against ``pickle.load``,
auto/span/whole modes, batches, DataLoader workers (fork and spawn), the allowlist, staleness."""

from __future__ import annotations

import json
import os
import pickle
import warnings
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from torch.utils.data import DataLoader

from picklegen import LAYOUTS, assert_same, build, datasets, oracle, write
from pickleshard import ShuffleSampler, errors
from pickleshard.dataset import PickleDataset
from pickleshard.errors import UnsupportedLayoutError
from pickleshard.index import FORMAT_VERSION, DatasetIndex, SkippedFilesWarning
from pickleshard.indexing.build import build_index
from pickleshard.indexing.opening import open_index
from pickleshard.pipelines.synth import write_synthetic
from rewrites import write_keeping_times

# pickles written with numpy 1.x module paths load through numpy's deprecated numpy.core shims
pytestmark = pytest.mark.filterwarnings("ignore:numpy.core:DeprecationWarning")


def _expected(files: list[Path], layout: str = "") -> list[Any]:
    """The samples of ``files`` by the oracle, in the producer's type: dicts keyed by field
    for the dict layouts, tuples otherwise."""
    out: list[Any] = []
    for p in files:
        names, samples = oracle(p)
        keyed = "dict" in layout
        out += [dict(zip(names, s, strict=True)) if keyed else s for s in samples]
    return out


def _assert_reads(ds: PickleDataset, want: list[tuple[Any, ...]]) -> None:
    assert len(ds) == len(want)
    for i, sample in enumerate(want):
        assert_same(ds[i], sample, _path=f"ds[{i}]")
    n = len(want)
    order = [n - 1, 0, *range(0, n, 2), n // 2, n - 1, *range(1, n, 3)] if n else []
    for got, i in zip(ds.__getitems__(order), order, strict=True):
        assert_same(got, want[i], _path=f"batch ds[{i}]")


def _columns(kind: str, n: int, seed: int) -> list[list[Any]]:
    rng = np.random.default_rng(seed)
    if kind == "arrays":
        xs: list[Any] = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(n)]
    else:
        xs = [
            {"tokens": rng.integers(0, 99, size=3).tolist(), "text": f"w{i}", "p": i / 7}
            for i in range(n)
        ]
    return [xs, rng.integers(0, 10, size=n).tolist(), [f"id{i}" for i in range(n)]]


# -- every layout, protocols 2-5, arrays and objects: span mode equals pickle.load ---------------


@pytest.mark.parametrize("kind", ["arrays", "objects"])
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("layout", [*LAYOUTS, "appended_dict_samples"])
def test_every_layout_reads_by_span_equal_to_pickle_load(
    tmp_path: Path, layout: str, protocol: int, kind: str
) -> None:
    (tmp_path / "data").mkdir()
    files = []
    for k, n in enumerate((5, 8)):
        cols = _columns(kind, n, seed=k)
        objs = (
            [dict(zip(("a", "b", "c"), s, strict=True)) for s in zip(*cols, strict=True)]
            if layout == "appended_dict_samples"
            else build(layout, cols, ["a", "b", "c"])
        )
        files.append(write(tmp_path / "data" / f"f{k}.pkl", objs, protocol))
    want = _expected(files, layout)
    ds = PickleDataset(tmp_path / "data", mode="span", jobs=1)
    assert ds.file_modes == ("span", "span")
    assert ds.fields == oracle(files[0])[0]
    _assert_reads(ds, want)
    whole = PickleDataset(tmp_path / "data", mode="whole")  # the same samples unpickled whole
    assert whole.file_modes == ("whole", "whole")
    _assert_reads(whole, want)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_an_ndarray_field_reads_rows_by_span_from_protocol_3(tmp_path: Path, protocol: int) -> None:
    (tmp_path / "data").mkdir()
    xs = np.arange(6 * 5, dtype=np.int16).reshape(6, 5)
    path = write(tmp_path / "data" / "a.pkl", [(xs, list(range(6)))], protocol)
    ds = PickleDataset(tmp_path / "data")
    assert ds.file_modes == (("whole",) if protocol == 2 else ("span",))
    if protocol == 2:  # array bytes are latin-1 text at protocol 2: read whole, reason given
        assert "numpy array" in (ds.index.files[0].reason or "")
    _assert_reads(ds, _expected([path]))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=datasets())
def test_generated_files_read_in_auto_mode_equal_pickle_load(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]
) -> None:
    folder = tmp_path_factory.mktemp("gen")
    objs = build(data["layout"], data["columns"], data["names"])
    path = write(folder / "f.pkl", objs, data["protocol"], numpy1=data["numpy1"])
    try:
        want = _expected([path], data["layout"])
    except UnsupportedLayoutError:
        assume(False)
    ds = PickleDataset(folder, jobs=1)
    if ds.file_modes == ("whole",):  # the scanner refused: the reason is recorded
        assert ds.index.files[0].reason
    _assert_reads(ds, want)


# -- modes -----------------------------------------------------------------------------------


def test_mode_span_on_a_protocol_0_file_raises_naming_the_file(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "data", files=1, per_file=3, shape=(2,))
    old = write_synthetic(
        tmp_path / "data", files=1, per_file=3, shape=(2,), protocol=0, prefix="p0"
    )
    with pytest.raises(errors.NotSpanIndexableError) as info:
        PickleDataset(tmp_path / "data", mode="span")
    assert str(old[0].resolve()) in str(info.value)
    assert "protocol 0 or 1" in info.value.reason
    with pytest.raises(ValueError, match="mode"):
        PickleDataset(tmp_path / "data", mode="fast")  # type: ignore[arg-type]


def test_auto_mode_mixes_span_and_whole_files(tmp_path: Path) -> None:
    files = write_synthetic(tmp_path / "data", files=2, per_file=4, shape=(3,), protocol=1)
    files += write_synthetic(tmp_path / "data", files=2, per_file=5, shape=(3,), prefix="q")
    ds = PickleDataset(tmp_path / "data")
    assert ds.mode == "auto"
    assert ds.file_modes == ("whole", "whole", "span", "span")
    assert ds.index.modes == ds.file_modes
    assert "span_files=2" in repr(ds)
    _assert_reads(ds, _expected(sorted(files)))
    assert ds.cache_stats.loads == 2  # only the protocol-1 files were unpickled whole
    assert ds.span_files.stats.loads == 2
    assert isinstance(ds.index.spans["starts"], np.memmap)
    assert ds.index.spans["starts"].shape == (10, 2)


def test_index_built_without_spans_reads_whole(tmp_path: Path) -> None:
    files = write_synthetic(tmp_path / "data", files=2, per_file=4, shape=(3,))
    build_index(tmp_path / "data", spans=False, jobs=1)
    ds = PickleDataset(tmp_path / "data")
    assert ds.file_modes == ("whole", "whole")
    assert ds.index.files[0].reason == "indexed without spans"
    _assert_reads(ds, _expected(files))
    with pytest.raises(errors.NotSpanIndexableError, match="indexed without spans"):
        PickleDataset(tmp_path / "data", mode="span")


def test_getitems_reads_each_file_in_offset_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pickleshard.read import SpanReader

    files = write_synthetic(tmp_path / "data", files=3, per_file=6, shape=(2,), kind="objects")
    ds = PickleDataset(tmp_path / "data", mode="span")
    reads: list[tuple[str, int]] = []

    def start(reader: SpanReader, i: int) -> tuple[str, int]:
        return Path(reader.path).name, int(reader.scan.starts[i].min())

    real = SpanReader._execute

    def traced(self: SpanReader, plan: Any, i: int, label: int) -> tuple[Any, ...]:
        reads.append(start(self, i))  # a sample read by the Python path
        return real(self, plan, i, label)

    class Spy:  # samples read by one compiled call (once a reader has its plan)
        def __init__(self, reader: SpanReader) -> None:
            self.reader, self.loader = reader, reader._here.get().loader

        def __getattr__(self, name: str) -> Any:
            return getattr(self.loader, name)

        def load_samples(
            self, fd: int, items: list[int], labels: list[int], fallback: Any
        ) -> list[Any]:
            out: list[Any] = []
            for i, label in zip(items, labels, strict=True):  # one at a time, to see the order
                fell: list[int] = []

                def fall(i: int, label: int, fell: list[int] = fell) -> Any:
                    fell.append(i)  # read by the Python path (traced there)
                    return fallback(i, label)

                out += self.loader.load_samples(fd, [i], [label], fall)
                if not fell:
                    reads.append(start(self.reader, i))
            return out

    monkeypatch.setattr(SpanReader, "_execute", traced)
    indices = [13, 2, 7, 0, 13, 17, 1, 6]  # files 2, 0, 1, 0, 2, 2, 0, 1
    for attempt in ("python path", "compiled"):
        with monkeypatch.context() as m:
            ds = PickleDataset(tmp_path / "data", mode="span")
            if attempt == "python path":  # no compiled loader: every sample read by _execute
                m.setattr(SpanReader, "_make_loader", lambda self, fd: None)
            else:
                ds.__getitems__(indices)  # settles each file's plan (given to its loader)
                for pos in range(3):
                    reader = ds.span_files.reader(pos)
                    assert reader.plan is not None
                    assert reader.plan.compiled
                    m.setattr(reader._here.get(), "loader", Spy(reader))
                    # its object fields read by SpanReader.many (the spied path), not decoded
                    m.setattr(reader._here.get().batch, "objects", None)
            reads.clear()
            batch = ds.__getitems__(indices)
        visited = [name for k, (name, _) in enumerate(reads) if k == 0 or reads[k - 1][0] != name]
        assert sorted(visited) == sorted(set(visited)) == [p.name for p in files]  # each once
        for name in visited:
            offsets = [at for n, at in reads if n == name]
            assert offsets == sorted(offsets), attempt  # in offset order
        assert len(reads) == len(indices)
    want = _expected(files)
    for got, i in zip(batch, indices, strict=True):
        assert_same(got, want[i])


def test_span_reads_go_through_a_local_file_advised_random(tmp_path: Path) -> None:
    """Span reads want no readahead: each file's reader reads through a LocalFile advised
    "random", and closing the dataset's readers closes their descriptors."""
    from pickleshard.io import LocalFile

    files = write_synthetic(tmp_path / "data", files=2, per_file=6, shape=(3,))
    ds = PickleDataset(tmp_path / "data", mode="span")
    want = _expected(files)
    assert_same(ds[7], want[7])
    reader = ds.span_files.reader(1)
    assert isinstance(reader.source, LocalFile)
    assert reader.source.pattern == "random"
    assert reader.source.name == str(files[1])
    ds.span_files.close()
    assert not reader.source._file.opened
    assert_same(ds[7], want[7])  # reopened on the next read


def test_open_readers_are_bounded_least_recently_used_closed_first(tmp_path: Path) -> None:
    files = write_synthetic(tmp_path / "data", files=3, per_file=4, shape=(3,))
    ds = PickleDataset(tmp_path / "data", mode="span")
    want = _expected(files)
    ds.span_files.max_open = 2
    first = ds.span_files.reader(0)
    for i in (1, 5, 2, 9):  # files 0, 1, 0, 2: file 1's reader is the least recently used
        assert_same(ds[i], want[i])
        assert len(ds.span_files) <= 2
    s = ds.span_files.stats
    assert (s.hits, s.misses, s.loads, s.evictions, s.entries) == (2, 3, 3, 1, 2)
    assert first.source._file.opened  # still open: used since file 1's was
    ds.span_files.max_open = 1  # closes the excess at once
    assert len(ds.span_files) == 1
    assert not first.source._file.opened
    assert_same(ds[1], want[1])
    with pytest.raises(ValueError, match="max_open must be >= 1"):
        ds.span_files.max_open = 0


def test_transform_applies_in_span_mode(tmp_path: Path) -> None:
    files = write_synthetic(tmp_path / "data", files=1, per_file=4, shape=(3,))
    ds = PickleDataset(tmp_path / "data", mode="span", transform=lambda s: (s[1], s[0].sum()))
    want = _expected(files)
    assert ds[2] == (want[2][1], want[2][0].sum())
    assert ds.__getitems__([3, 1]) == [ds[3], ds[1]]


# -- processes -------------------------------------------------------------------------------


class _Traced(PickleDataset):
    """Returns, with each sample, its index, the worker's pid and how many readers it built."""

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        samples = super().__getitems__(indices)
        opened = self.span_files.stats.loads
        return [(int(i), s, os.getpid(), opened) for i, s in zip(indices, samples, strict=True)]


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_dataloader_workers_read_by_span(tmp_path: Path) -> None:
    files = write_synthetic(tmp_path / "data", files=4, per_file=9, shape=(3,), seed=3)
    want = _expected(files)
    ds = _Traced(tmp_path / "data", mode="span")
    ds[0]  # readers opened in the parent must not be used by the children
    assert len(ds.span_files) == 1
    sampler = ShuffleSampler(ds, seed=5)
    loader = DataLoader(
        ds,
        sampler=sampler,
        batch_size=5,
        num_workers=2,
        collate_fn=_as_list,
        multiprocessing_context="fork",
    )
    seen, pids = [], set()
    for batch in loader:
        for i, sample, pid, opened in batch:
            assert_same(sample, want[i], _path=f"worker {pid}: ds[{i}]")  # every field
            assert 1 <= opened <= 4  # each worker built its own readers
            seen.append(i)
            pids.add(pid)
    assert sorted(seen) == list(range(len(ds)))
    assert len(pids) == 2
    assert os.getpid() not in pids
    assert ds.span_files.stats.loads == 1  # the parent's readers are untouched


def test_pickled_dataset_leaves_readers_behind(tmp_path: Path) -> None:
    files = write_synthetic(tmp_path / "data", files=2, per_file=5, shape=(3,))
    ds = PickleDataset(tmp_path / "data", mode="span", allow_globals=["fractions.Fraction"])
    for i in range(len(ds)):
        ds[i]
    data = pickle.dumps(ds)
    assert len(data) < 4096
    back = pickle.loads(data)
    assert (len(back.span_files), back.span_files.stats.loads) == (0, 0)
    assert back.policy == ds.policy
    _assert_reads(back, _expected(files))


def test_spawned_dataloader_worker_reads_by_span(tmp_path: Path) -> None:
    files = write_synthetic(tmp_path / "data", files=2, per_file=6, shape=(4,))
    want = _expected(files)
    ds = PickleDataset(tmp_path / "data", mode="span")
    ds[0]
    loader = DataLoader(ds, batch_size=5, num_workers=1, multiprocessing_context="spawn")
    xs, ys = [], []
    for x, y in loader:
        xs.append(x)
        ys.append(y)
    assert torch.equal(torch.cat(ys), torch.tensor([s[1] for s in want]))
    assert torch.equal(torch.cat(xs), torch.from_numpy(np.stack([s[0] for s in want])))


# -- safety ----------------------------------------------------------------------------------


def test_unsafe_global_in_span_mode_names_global_file_and_sample(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "f.pkl"
    path.write_bytes(pickle.dumps(([1, 2, 3], [Fraction(1, 2), Fraction(1, 3), 4]), protocol=4))
    with pytest.raises(errors.UnsafePickleError, match=r"fractions\.Fraction"):
        PickleDataset(tmp_path / "data")  # the up-front audit (producers.openaudit)
    # without the audit, indexing reads opcodes only: nothing is refused until a read
    ds = PickleDataset(tmp_path / "data", audit=False)
    assert ds.file_modes == ("span",)
    assert ds[2] == (3, 4)
    with pytest.raises(errors.UnsafePickleError) as info:
        ds[1]  # its Fraction global is defined by sample 0 and replayed
    message = str(info.value)
    assert "fractions.Fraction" in message
    assert str(path.resolve()) in message
    assert info.value.sample == 1
    assert "(sample 1)" in message
    with pytest.raises(errors.UnsafePickleError):
        ds.__getitems__([2, 0])
    allowed = PickleDataset(tmp_path / "data", allow_globals=["fractions.Fraction"])
    assert allowed.__getitems__([1, 0]) == [(2, Fraction(1, 3)), (1, Fraction(1, 2))]
    assert PickleDataset(tmp_path / "data", trusted=True)[0] == (1, Fraction(1, 2))


def test_python2_pickle_reads_by_span_with_an_encoding(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    data = b"\x80\x02]q\x00(U\x01aq\x01U\x01\xe9q\x02e]q\x03(K\x01K\x02e\x86q\x04."
    (tmp_path / "data" / "py2.pkl").write_bytes(data)
    ds = PickleDataset(tmp_path / "data", mode="span", encoding="latin1")
    assert ds[1] == ("\xe9", 2)


# -- staleness and index format --------------------------------------------------------------


def test_stale_span_index_is_detected(tmp_path: Path) -> None:
    paths = write_synthetic(tmp_path / "data", files=2, per_file=4, shape=(8,))
    PickleDataset(tmp_path / "data")
    raw = bytearray(paths[1].read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    write_keeping_times(paths[1], bytes(raw))
    with pytest.raises(errors.StaleIndexError, match="part-00001"):
        PickleDataset(tmp_path / "data")
    write_synthetic(tmp_path / "data", files=2, per_file=6, shape=(8,), seed=9)
    ds = PickleDataset(tmp_path / "data", rebuild="auto")
    assert len(ds) == 12
    _assert_reads(ds, _expected(paths))


def test_an_index_of_an_older_format_is_rebuilt_or_refused(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "data", files=2, per_file=3, shape=(2,))
    index = build_index(tmp_path / "data", jobs=1)
    header = json.loads((index.path / "index.json").read_text())
    (index.path / "index.json").write_text(json.dumps({**header, "version": 1}))
    with pytest.raises(errors.IndexFormatError, match="older pickleshard"):
        DatasetIndex.open(index.path)
    with pytest.raises(errors.IndexFormatError, match="older pickleshard"):
        open_index(tmp_path / "data", rebuild="never")
    opened, _ = open_index(tmp_path / "data")  # "missing": an old format counts as missing
    assert opened.header["version"] == FORMAT_VERSION
    assert opened.modes == ("span", "span")


# -- skip-bad --------------------------------------------------------------------------------


def test_dataset_over_an_index_with_skipped_files_warns(tmp_path: Path) -> None:
    files = write_synthetic(tmp_path / "data", files=2, per_file=3, shape=(2,))
    (tmp_path / "data" / "bad.pkl").write_bytes(b"not a pickle at all")
    with pytest.raises(errors.NotAPickleError, match=r"bad\.pkl"):
        PickleDataset(tmp_path / "data")
    with pytest.warns(SkippedFilesWarning, match=r"1 bad file\(s\).*bad\.pkl"):
        ds = PickleDataset(tmp_path / "data", skip_bad=True)
    _assert_reads(ds, _expected(files))
    with pytest.warns(SkippedFilesWarning):  # reopening the index warns again
        PickleDataset(tmp_path / "data")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (tmp_path / "data" / "bad.pkl").unlink()
        with pytest.raises(errors.StaleIndexError, match=r"bad\.pkl"):  # its removal is a change
            PickleDataset(tmp_path / "data")
