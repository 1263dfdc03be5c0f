"""``PickleDataset``: a map-style dataset over a folder of pickle files.

It needs no import of torch: ``torch.utils.data.DataLoader`` accepts any object with
``__len__`` and ``__getitem__``, and calls ``__getitems__`` for a whole batch when present.
"""

from __future__ import annotations

import bisect
import itertools
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar

try:  # a real torch Dataset when torch is there (isinstance checks, typing); plain class if not
    from torch.utils.data import Dataset as _DatasetBase
except ImportError:  # pragma: no cover - exercised only without torch
    # generic, as torch's is: the class statement below subscripts it
    _T = TypeVar("_T")

    class _DatasetBase(Generic[_T]):  # type: ignore[no-redef]
        """Stands in for ``torch.utils.data.Dataset``."""


from .errors import NotSpanIndexableError, UnsafePickleError
from .index import SkippedFilesWarning
from .indexing.openaudit import audit_dataset_source, audit_opened
from .indexing.opening import Rebuild, open_index
from .io.handles import ProcessLocal, WeakMethod
from .io.listing import Source
from .io.lru import CacheStats
from .io.options import SourceOptions, source_options
from .io.remote.source import is_url
from .read import SpanFiles
from .read.ahead import prefetch_samples
from .read.batchread import BatchReader
from .read.collate import batch_allocator
from .read.whole.cache import CacheBudget, WholeFileCache
from .read.whole.load import load_layout
from .read.whole.mapped import whole_loader
from .safety.allowlist import preset_names
from .safety.bounds import DEFAULT_MAX_DEPTH, DEFAULT_MAX_SAMPLE_BYTES, check_sample
from .safety.policy import UnpicklePolicy
from .scan.ambiguity import warn_ambiguous
from .scan.filemeta import metadata_from_json
from .scan.layouts import DecodedLayout, LayoutChoice

__all__ = ["DEFAULT_CACHE_BYTES", "Mode", "PickleDataset"]

DEFAULT_CACHE_BYTES = 1 << 30

Sample = tuple[Any, ...]
Mode = Literal["auto", "span", "whole"]


class PickleDataset(_DatasetBase[Any]):
    """Samples of every pickle file under ``source``, by global index.

    ``source`` is a directory (searched recursively for ``*.pkl``, ``*.pickle``, ``*.pk``,
    ``*.p``), a glob (``"data/**/data_batch_*"``: files of any name), or a list of files. The index is opened from ``index`` (default
    ``DIR/.pickleshard``), built when missing, and checked against the files: see
    :func:`pickleshard.open_index` for ``rebuild``. ``skip_bad=True`` builds it leaving out bad
    files (see :func:`pickleshard.build_index`); a dataset over an index that skipped files
    warns how many (:class:`~pickleshard.index.SkippedFilesWarning`).

    ``ds[i]`` returns the sample in the type its producer wrote (:attr:`sample_form`): a dict
    keyed by field where the producer wrote dicts (dict records or rows, a dict of columns),
    else a tuple with one element per field, ``(x, y)`` for the common layout; ``transform``,
    if given, is applied to that sample.

    ``mode`` says how samples are read. ``"auto"`` (default): each sample of a span-indexed file
    is read alone, straight out of the pickle (:class:`~pickleshard.read.SpanReader`), and
    the files the scanner refused are unpickled whole; ``"span"``: like auto, but raises
    :class:`~pickleshard.errors.NotSpanIndexableError` naming the first file that cannot be read
    by span and why; ``"whole"``: every file is unpickled whole. :attr:`file_modes` says which
    way each file is read. Span reads have no locality to protect: shuffle with
    :class:`pickleshard.ShuffleSampler` (or ``shuffle=True``); files read whole are better
    served by :class:`pickleshard.BlockShuffleSampler`.

    Unpickling is restricted to an allowlist of globals (builtin containers, numpy arrays,
    torch tensors; see :mod:`pickleshard.safety.policy`): anything else raises
    :class:`~pickleshard.errors.UnsafePickleError` naming the global and the file (and, in span
    reads, the sample's index in the dataset). ``trusted=True`` lifts the restriction,
    ``allow_globals=["module.name"]`` extends it, ``allow="pandas"`` (or ``"dill"``,
    ``"pil"``, ``"scipy.sparse"``, or a list of them) adds a vetted preset
    (:data:`pickleshard.safety.allowlist.PRESETS`). Opening audits every indexed file's globals
    (opcodes only; after the index is opened or built, before any sample is read) and raises one :class:`~pickleshard.errors.UnsafePickleError` listing every
    refused global with its file count and what to pass (:mod:`pickleshard.indexing.openaudit`;
    ``audit=False`` skips it: refusals then come at the read that meets them).
    ``encoding`` is as in :func:`pickle.load`: Python 2 pickles need ``"latin1"`` (numpy
    arrays) or ``"bytes"`` (a :class:`~pickleshard.errors.TextEncodingError` says so).
    A sample that decodes to more than ``max_sample_bytes`` or nests deeper than ``max_depth``
    raises :class:`~pickleshard.errors.SampleLimitError` naming the file and the sample before
    it is handed out (None lifts a bound; see :mod:`pickleshard.safety.bounds`).

    ``source`` may be a URL (``s3://bucket/prefix/``, ``gs://``, ``https://``: anything fsspec
    opens); ``storage_options`` go to its filesystem (credentials, endpoint), never into the
    index, which is kept locally by default (see :mod:`pickleshard.io.remote.listing`). They
    belong to this dataset (:attr:`source_options`): another dataset on the same bucket keeps
    its own, and DataLoader workers get them with the pickled dataset. ``block_cache_bytes``
    keeps fetched blocks of remote objects in an LRU of that many bytes per process (None, the
    default: no cache); ``source_options.block_cache.stats`` count its hits and misses. A
    :class:`~pickleshard.io.SourceOptions` may be given as ``storage_options`` instead (its own
    block cache and block size, then without ``block_cache_bytes``).

    ``__getitems__`` fetches a batch in (file, offset) order, touching each file once, and
    returns it in request order.

    Whole-file mode keeps decoded files in an LRU cache bounded by ``cache_bytes`` of estimated
    decoded size, *in total across DataLoader workers*: :attr:`budget`, a
    :class:`~pickleshard.read.whole.cache.CacheBudget`, gives each of ``n`` workers
    ``cache_bytes // n``. Each process has its own cache (a forked worker starts empty), and so
    its own span readers.

    ``layout`` says what a file or record is: ``"columns"`` (``(x_list, y_list)``, a dict of
    columns), ``"records"`` (each appended pickle, or each item of a top-level list, is one
    sample), ``"file"`` (the file's one pickle is one sample); ``"auto"`` (default) infers it
    and warns (:class:`~pickleshard.AmbiguousLayoutWarning`, once) when another reading
    is as plausible, naming the argument that picks it. See :mod:`pickleshard.scan.layouts`.
    A one-pickle dict's scalar values (CIFAR's ``batch_label``) are :meth:`file_metadata`.
    """

    def __init__(
        self,
        source: Source,
        *,
        index: str | os.PathLike[str] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        rebuild: Rebuild = "missing",
        transform: Callable[[Sample], Any] | None = None,
        trusted: bool = False,
        allow_globals: Iterable[str] = (),
        allow: str | Iterable[str] = (),
        encoding: str = "ASCII",
        jobs: int | None = None,
        progress: bool = False,
        mode: Mode = "auto",
        skip_bad: bool = False,
        max_sample_bytes: int | None = DEFAULT_MAX_SAMPLE_BYTES,
        max_depth: int | None = DEFAULT_MAX_DEPTH,
        storage_options: Mapping[str, Any] | SourceOptions | None = None,
        audit: bool = True,
        layout: LayoutChoice = "auto",
        block_cache_bytes: int | None = None,
    ) -> None:
        # what a URL's objects are opened with (s3://...: see docs/remote.md); pickled with us
        self.source_options = source_options(storage_options, block_cache_bytes) or SourceOptions()
        self.budget = CacheBudget(cache_bytes)  # ValueError if negative
        if mode not in ("auto", "span", "whole"):
            raise ValueError(f"mode must be 'auto', 'span' or 'whole', got {mode!r}")
        self.policy = UnpicklePolicy.from_args(
            trusted=trusted,
            allow_globals=[*allow_globals, *preset_names(allow)],
            encoding=encoding,
            max_sample_bytes=max_sample_bytes,
            max_depth=max_depth,
        )
        try:
            self.index, self.source = open_index(
                source,
                index=index,
                rebuild=rebuild,
                jobs=jobs,
                progress=progress,
                policy=self.policy,
                skip_bad=skip_bad,
                layout=layout,
                storage_options=self.source_options,
            )
        except UnsafePickleError:
            if audit:  # a file unpickled whole refused one global: name every one
                audit_dataset_source(source, index, self.policy, jobs, self.source_options)
            raise
        if audit:  # every refused global, at once, before any is met in a read
            audit_opened(self.index, self.source, self.policy, jobs)
        self.layout = layout
        # tuples or dicts, as the producer wrote them (settable: convert reads tuples)
        self.sample_form = self.index.sample_form
        self.mode = mode
        self.transform = transform
        self._paths = [os.fspath(self.source.absolute(f.path)) for f in self.index.files]
        self._positions = {path: pos for pos, path in enumerate(self._paths)}
        if mode == "span":
            for f, path in zip(self.index.files, self._paths, strict=True):
                if f.mode != "span":
                    raise NotSpanIndexableError(path, f.reason or "indexed without spans")
        self.file_modes: tuple[str, ...] = (
            ("whole",) * len(self._paths) if mode == "whole" else self.index.modes
        )
        self._is_span = [m == "span" for m in self.file_modes]
        self._n = self.index.num_samples
        # first global index of each file (samples are numbered file after file)
        self._firsts = [0, *itertools.accumulate(f.num_samples for f in self.index.files)][:-1]
        self._cache: ProcessLocal[WholeFileCache] | None = None
        self._spans = SpanFiles(self.index, self._paths, self.policy, options=self.source_options)
        if self.index.skipped:
            skipped = self.index.skipped
            names = ", ".join(str(s["path"]) for s in skipped[:5])
            warnings.warn(
                f"{self.index.path}: {len(skipped)} bad file(s) were skipped when indexing and "
                f"are not in this dataset: {names}{' ...' if len(skipped) > 5 else ''} "
                "(see DatasetIndex.skipped for each error)",
                SkippedFilesWarning,
                stacklevel=2,
            )
        notes = [f.ambiguity for f in self.index.files]
        warn_ambiguous(zip(self._paths, notes, strict=True), stacklevel=3)

    def file_metadata(self, file: int | str | os.PathLike[str]) -> dict[str, Any]:
        """The metadata of a file (its position in :attr:`index`'s files table, or its path):
        the scalar values beside the columns of a one-pickle dict, by name (``{"batch_label":
        b"training batch 1 of 5"}`` for a CIFAR batch); empty when it has none."""
        if not isinstance(file, int):
            path = os.fspath(file)
            file = self._positions.get(path, self._positions.get(os.path.realpath(path), -1))
            if file < 0:
                raise KeyError(f"{path} is not a file of this dataset")
        stored = self.index.files[file].metadata
        return metadata_from_json(stored) if stored else {}

    @property
    def fields(self) -> tuple[str, ...]:
        return self.index.fields

    @property
    def remote(self) -> bool:
        """Whether any of its files is a remote object (a URL read by byte range): a
        :class:`~pickleshard.Loader` then reads ahead in threads."""
        return any(is_url(path) for path in self._paths)

    def __len__(self) -> int:
        return self.index.num_samples

    def _load(self, path: str) -> DecodedLayout:
        # the file as indexed, checked before and after the load (a rewrite during an epoch)
        pos = self._positions[path]
        entry = self.index.files[pos]
        decoded = load_layout(
            path,
            self.policy,
            identity=entry.identity,
            layout=self.layout,
            options=self.source_options,
        )
        # once per load, not per sample: the cache hands out only what passed it here
        self.index.check_decoded(pos, path, decoded.num_samples, decoded.fields)
        return decoded

    @property
    def cache_bytes(self) -> int:
        """The whole-file cache budget in total across workers (:attr:`budget`'s ``total_bytes``);
        setting it replaces :attr:`budget` and drops this process's cache."""
        return self.budget.total_bytes

    @cache_bytes.setter
    def cache_bytes(self, value: int) -> None:
        self.budget = CacheBudget(value)
        self._cache = None

    @property
    def cache(self) -> WholeFileCache:
        """This process's whole-file cache, created on first use with its share of the budget."""
        if self._cache is None:  # a worker's cache has its own share and loader: one per process
            self._cache = ProcessLocal(WeakMethod(self, "_new_cache"))  # self weakly: no cycle
        return self._cache.get()

    def _new_cache(self) -> WholeFileCache:
        load = whole_loader(
            WeakMethod(self, "_load"), self.index, self._positions, self.policy, self.source_options
        )
        return WholeFileCache(self.budget.share_here(), load)

    @property
    def cache_stats(self) -> CacheStats:
        return self.cache.stats

    def _check(self, i: int) -> int:
        n = len(self)
        j = int(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"sample index {i} out of range for a dataset of {n} samples")
        return j

    def _file(self, pos: int) -> DecodedLayout:
        return self.cache.get(self._paths[pos], self.index.files[pos].decoded_nbytes)

    def _finish(self, sample: Sample, pos: int, index: int) -> Any:
        policy = self.policy
        check_sample(sample, self._paths[pos], index, policy.max_sample_bytes, policy.max_depth)
        built = self.sample_form.build(sample)
        return built if self.transform is None else self.transform(built)

    @property
    def span_files(self) -> SpanFiles:
        """This process's span readers (opened on first use)."""
        return self._spans

    def __getitem__(self, i: int) -> Any:
        j = i if type(i) is int and 0 <= i < self._n else self._check(i)
        pos = bisect.bisect_right(self._firsts, j) - 1
        item = j - self._firsts[pos]
        if self._is_span[pos]:  # the read holds the sample to the policy's bounds
            sample = self.sample_form.build(self._spans.one(pos, item, j))
            return sample if self.transform is None else self.transform(sample)
        columns = self._file(pos).columns
        return self._finish(tuple([col[item] for col in columns]), pos, j)

    def __getitems__(self, indices: Sequence[int]) -> Sequence[Any]:
        """Samples ``indices``, in request order, read as one batch plan (see
        :mod:`pickleshard.read.batchread`): a :class:`~pickleshard.read.batch.SampleBatch`
        whose samples equal ``ds[i]``'s and whose columns :func:`pickleshard.collate` hands over
        as the batch's tensors; with a ``transform``, a list of the transformed samples."""
        return self.read_batch(indices)

    def read_batch(self, indices: Sequence[int], *, pin_memory: bool = False) -> Sequence[Any]:
        """:meth:`__getitems__`, its array columns in page-locked memory with ``pin_memory``
        (what :class:`pickleshard.Loader` asks for: no copy to pin the batch's tensors)."""
        batch = self._batches.read(indices, batch_allocator(pin_memory))
        if self.transform is None:
            return batch
        return [self.transform(sample) for sample in batch]

    def prefetch(self, indices: Sequence[int]) -> None:
        """Hint: samples ``indices`` are read next (a :class:`~pickleshard.Loader`'s coming
        batches): a remote file's ranges are fetched together now and staged for those reads
        (:func:`~pickleshard.read.ahead.prefetch_samples`); local files ignore it."""
        prefetch_samples(self._firsts, self._is_span, self._spans, indices)

    @property
    def _batches(self) -> BatchReader:
        reader = self.__dict__.get("_batch_reader")
        if reader is None:
            reader = self._batch_reader = BatchReader(
                self._firsts,
                self._is_span,
                self._spans,
                # self held weakly: a cycle would keep a dropped dataset's files open
                WeakMethod(self, "_file"),
                WeakMethod(self, "_bounded"),
                self.sample_form,
                self._n,
            )
        return reader

    def _bounded(self, sample: Sample, pos: int, index: int) -> Sample:
        policy = self.policy
        check_sample(sample, self._paths[pos], index, policy.max_sample_bytes, policy.max_depth)
        return sample

    def __getstate__(self) -> dict[str, Any]:
        # Spawned workers reopen the index by path; the cache and the span readers never travel.
        state = self.__dict__.copy()
        state["_cache"] = None
        state.pop("_batch_reader", None)
        return state

    def __repr__(self) -> str:
        return (
            f"PickleDataset({os.fspath(self.source.root)!r}, files={len(self._paths)}, "
            f"samples={len(self)}, fields={self.fields}, mode={self.mode!r}, "
            f"span_files={sum(self._is_span)})"
        )
