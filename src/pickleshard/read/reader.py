"""Read samples straight out of an unmodified pickle file: one :class:`SpanReader` per file.

The reader executes the file's :class:`~pickleshard.read.plan.ReadPlan`, settled by the first
read in each process (:meth:`SpanReader._settle`): an ``array_row`` field is read by
:class:`~pickleshard.read.items.ArrayRows`; an :class:`~pickleshard.scan.ArrayItem` field, once
one of its samples unpickled from its span proved the same array, by
:class:`~pickleshard.read.items.ArrayItems`; an :class:`~pickleshard.scan.IntItem` field by
:class:`~pickleshard.read.ints.IntColumn`; any other field by span
(:class:`~pickleshard.read.spans.SpanFields`). With the compiled extension, a plan whose fields
are small ints with decoded values, array items and at most one span is also given to
``pickleshard._cscan.SpanLoader``, which then reads a whole sample (and a batch of them) in one
call that also checks the file's identity and the samples' bounds; anything it declines takes
the Python path, which is the reference.

Bytes come from the file's :class:`~pickleshard.io.ByteSource` (a
:class:`~pickleshard.io.LocalFile` advised for random reads unless one is given), the compiled
loader reading its ``fileno()``. Reads check what they rely on: an array read from its payload is
read with the bytes around it, which must be the framing the scan proved; a small int is decoded
only from its opcode; and the file's identity (size, mtime, ctime, inode, as indexed) is checked
when it is opened and after the reads of every call, so a write that raced a read is caught
before its samples are returned, as :class:`~pickleshard.errors.FileChangedError` naming the file
and the sample. What no check can see: a file whose payload bytes alone changed while its size,
mtime *and* ctime stayed.

Errors name a sample label (a dataset's global index), an argument of every read.
:meth:`read_sample` / :meth:`read_samples` take indices as a caller gives them; :meth:`one` /
:meth:`many` what a dataset calls once it has checked and ordered its indices."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np

from ..errors import CorruptPickleError, FileChangedError, PickleshardError
from ..io import ByteSource, open_source
from ..io.handles import ProcessLocal, WeakMethod
from ..io.identity import FileIdentity
from ..picklekit.rewrite import BIG, FindClass
from ..picklekit.unpicklers import MemoIdPastSpan
from ..picklekit.walk import resolve_engine
from ..safety.bounds import check_sample
from ..safety.policy import AllowlistFindClass
from ..scan import ScanResult
from .failures import changed, damaged, named, past_span
from .items import ArrayItems
from .plan import ITEM, ReaderStats, ReadPlan
from .planner import compile_plan, fetch_ranges, make_loader, settle_plan
from .spans import SLOW, SpanFields

__all__ = ["BATCH_READ_MIN", "Opened", "SpanReader"]

BATCH_READ_MIN = 16  # samples of one file that many() reads field by field (fewer: one by one)


class Opened:
    """A reader's file as one process opened it: the source's descriptor (-1: none, a remote
    or compressed source), the compiled loader reading it (None: the Python path) and what
    the batch path keeps for it (:class:`~pickleshard.read.batchread.FileFill`)."""

    __slots__ = ("__weakref__", "batch", "fd", "loader")

    def __init__(self, fd: int, loader: Any) -> None:
        self.fd, self.loader = fd, loader
        self.batch: Any = None


class SpanReader:
    """Reads samples of one scanned file by span; one per file and process.

    ``encoding`` / ``errors`` are those of :func:`pickle.load`. ``find_class(module, name)``
    replaces the global lookup of every unpickler this reader builds; by default
    (``"allowlist"``) it is the allowlist of :mod:`pickleshard.safety.policy`, and ``None`` (a trusted
    file) is the plain lookup. ``general=True`` reads every pickle span with the pure-Python
    general path; ``engine`` picks the fast path's span rewrite, compiled or Python. Immutable
    shared values are cached up to ``shared_bytes``. ``identity`` (default: the scanned size) is
    what the file must still be; ``verify=False`` turns the checks off (only the benchmark that
    measures their cost uses it). ``source`` is the file's byte source (default: a
    :class:`~pickleshard.io.LocalFile` of ``scan.path`` advised ``"random"``); it opens in each
    process on first use, and a pickled reader travels without it. ``bounds``, a policy's
    ``(max_sample_bytes, max_depth)``: every sample returned is held to them
    (:func:`~pickleshard.safety.bounds.check_sample`, in the compiled read's own call when it reads
    the sample); None: not checked here (the caller does).
    """

    def __init__(
        self,
        scan: ScanResult,
        *,
        encoding: str = "ASCII",
        errors: str = "strict",
        find_class: FindClass | Literal["allowlist"] | None = "allowlist",
        general: bool = False,
        shared_bytes: int = 64 << 20,
        big: int = BIG,
        engine: str = "auto",
        identity: FileIdentity | None = None,
        verify: bool = True,
        source: ByteSource | None = None,
        bounds: tuple[int | None, int | None] | None = None,
    ) -> None:
        # plain ndarray views of the index's memory-mapped arrays: np.memmap's Python-level
        # __array_finalize__ runs on every slice of a memmap, several times per sample read
        self.scan = scan = replace(
            scan,
            starts=np.asarray(scan.starts),
            ends=np.asarray(scan.ends),
            memo_base=np.asarray(scan.memo_base),
            ext_offsets=np.asarray(scan.ext_offsets),
            ext_keys=np.asarray(scan.ext_keys),
            records=np.asarray(scan.records),
        )
        self.path = scan.path
        if source is None:  # a compressed file comes decompressed
            source = open_source(scan.path)
            source.advise("random")
        self.source = source
        self.identity = identity if identity is not None else FileIdentity(scan.size)
        self.verify = verify
        self.bounds = bounds
        if isinstance(find_class, str):  # restricted unless the caller says otherwise
            find_class = AllowlistFindClass(scan.path)
        self.encoding, self.errors, self.find_class = encoding, errors, find_class
        self.general = general
        self.engine = resolve_engine(engine)
        self.stats = ReaderStats()
        self.spans = SpanFields(
            scan,
            self.source,
            self.stats,
            encoding=encoding,
            errors=errors,
            find_class=find_class,
            general=general,
            engine=self.engine,
            big=big,
            shared_bytes=shared_bytes,
            bad_span=WeakMethod(self, "_bad_span"),
        )
        self._n = scan.num_samples
        # the file as this process opened it; callbacks hold self weakly (WeakMethod): a cycle
        # would keep a dropped reader's descriptor and maps until a collection
        self._here = ProcessLocal(WeakMethod(self, "_open"))
        self._plan: ReadPlan | None = None

    @property
    def plan(self) -> ReadPlan | None:
        """How this process reads each field of the file (None until its first read)."""
        return self._plan

    def opened(self) -> tuple[Opened, ReadPlan]:
        """The file as this process reads it, opened (its identity checked) on first use, and
        its settled plan."""
        here = self._here.get()
        plan = self._plan
        if plan is None:
            plan = self._plan = self._settle()
        return here, plan

    # -- the file -----------------------------------------------------------------------------

    def close(self) -> None:
        if (here := self._here.peek()) is not None and here.batch is not None:
            here.batch = here.batch.close()  # the batch path's state of the file goes with it
        self.source.close()
        self._here.close()

    def __enter__(self) -> SpanReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_plan=None)  # the ProcessLocal travels without its value
        return state

    def _open(self) -> Opened:
        """This process's view of the file (what :attr:`_here` holds): opened (its identity
        checked), caches emptied, the compiled loader built (and given the plan when there is
        one)."""
        self.spans.reset()
        fd = self.source.fileno()  # opens it: an UnreadableFileError names the file
        fd = -1 if fd is None else fd
        if self.verify:  # a file replaced or rewritten since the scan is refused on open
            try:
                self._check_opened()
            except PickleshardError:
                self.source.close()  # and checked again on the next open
                raise
        loader = self._make_loader(fd)
        if self._plan is not None and self._plan.compiled:
            self._plan = compile_plan(self._plan, loader, self.scan, self.spans.definers)
        return Opened(fd, loader)

    def _check_opened(self) -> None:
        what = self.identity.differs_from(self.source.identity())  # a shorter size included
        if what is not None:
            raise changed(self.path, what, None, None)

    def read_raw(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset``, the file opened (checked after: :meth:`check_identity`)."""
        self._here.get()
        data = self.source.read_at(offset, n)
        self.stats.bytes_read += len(data)
        return data

    def check_identity(self, samples: Sequence[int]) -> None:
        """Raise :class:`FileChangedError` naming ``samples`` if the file is no longer the one
        indexed (nothing unless ``verify``): after raw reads, a racing write shows by now."""
        if self.verify:
            self._here.get()
            self._check_same(samples)

    def _check_same(self, samples: Sequence[int] | None) -> None:
        what = self.identity.differs_from(self.source.identity())
        if what is not None:
            raise changed(self.path, what, None, samples)

    def _make_loader(self, fd: int) -> Any:
        """This process's compiled loader of descriptor ``fd``, or None (see
        :func:`make_loader`)."""
        if self.engine != "compiled" or self.general or fd < 0:
            return None
        identity = self.identity if self.verify else None
        bounded = None if self.bounds is None else (*self.bounds, WeakMethod(self, "_bounded_one"))
        stale, restricted = WeakMethod(self, "_stale"), self.find_class is not None
        return make_loader(self.scan, self.spans, restricted, identity, stale, bounded)

    def _bounded_one(self, sample: Any, label: int) -> Any:
        return self._bounded([sample], [label])

    def _bounded(self, samples: list[Any], labels: list[int]) -> list[Any]:
        """``samples``, each held to :attr:`bounds` (when set): a
        :class:`~pickleshard.errors.SampleLimitError` names the label of one that passes them."""
        if self.bounds is not None:
            for sample, label in zip(samples, labels, strict=True):
                check_sample(sample, self.path, label, *self.bounds)
        return samples

    def _stale(self, what: str | None, offset: int, samples: list[int]) -> Exception:
        """The compiled reads' error for a changed file: ``what`` changed (None: its identity,
        described here), at ``offset`` (-1: none), while reading ``samples``."""
        if what is None:
            what = self.identity.differs_from(self.source.identity()) or "its identity changed"
        return changed(self.path, what, offset if offset >= 0 else None, samples)

    def _named(self, exc: PickleshardError, label: int | None) -> PickleshardError:
        """:func:`named`, but a file changed since indexed where bytes end early or are bad."""
        mine = self.verify and self._here.opened
        if isinstance(exc, CorruptPickleError) and not isinstance(exc, FileChangedError) and mine:
            what = self.identity.differs_from(self.source.identity())
            if what is not None:
                return changed(self.path, what, exc.offset, None if label is None else [label])
        return named(exc, label)

    def _bad_span(self, start: int, exc: Exception, label: int | None) -> Exception:
        """The error for the span at ``start`` that raised ``exc`` read for sample ``label``."""
        if not isinstance(exc, MemoIdPastSpan):
            return self._named(damaged(self.path, start, exc), label)
        # a file rewritten since its scan is the likelier cause, but only its identity can say
        mine = self._here.opened
        what = self.identity.differs_from(self.source.identity()) if self.verify and mine else None
        return past_span(self.path, exc, label, what)

    def _settle(self) -> ReadPlan:
        """This process's plan (see :func:`~pickleshard.read.planner.settle_plan`), given to
        its compiled loader when it compiles."""
        plan = settle_plan(
            self.scan, self.source, self.stats, self.spans, self.verify, self.general
        )
        return compile_plan(plan, self._here.get().loader, self.scan, self.spans.definers)

    # -- reads ----------------------------------------------------------------------------------

    def read_sample(self, i: int) -> tuple[Any, ...]:
        """Sample ``i`` (negative counts from the end) as a tuple with one value per field,
        equal to the whole-file reading; a refused global names sample ``i``."""
        n = self._n
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {self.path} ({n} samples)")
        i = int(i) + n if i < 0 else int(i)
        return self.one(i, i)

    def read_samples(
        self, indices: Sequence[int], labels: Sequence[int] | None = None
    ) -> list[tuple[Any, ...]]:
        """Samples at ``indices`` (in that order), equal to :meth:`read_sample` of each; a
        refused global names ``labels[k]`` for ``indices[k]`` (default: the index itself)."""
        wanted = np.asarray(indices, np.int64).reshape(-1)  # ints, an array of them, or one
        if not len(wanted):
            return []
        n = self._n
        if int(wanted.min()) < -n or int(wanted.max()) >= n:
            bad = next(int(i) for i in wanted.tolist() if not -n <= i < n)
            raise IndexError(f"sample {bad} out of range for {self.path} ({n} samples)")
        wanted = np.where(wanted < 0, wanted + n, wanted)
        names = wanted if labels is None else np.asarray(labels, np.int64).reshape(-1)
        order = np.argsort(wanted, kind="stable")
        got = self.many(wanted[order].tolist(), names[order].tolist())
        out: list[tuple[Any, ...]] = [()] * len(got)
        for k, value in zip(order.tolist(), got, strict=True):
            out[k] = value
        return out

    def one(self, i: int, label: int) -> tuple[Any, ...]:
        """Sample ``i`` (in range: the caller checked), errors naming ``label``; the file's
        identity is checked after the reads."""
        here = self._here.get()
        plan = self._plan
        if plan is None:
            plan = self._plan = self._settle()
        if plan.compiled:
            try:
                got = here.loader.load_sample(here.fd, i, self.verify, label)
            except PickleshardError as exc:
                raise self._named(exc, label) from None
            except Exception as exc:  # bad bytes make the unpickler raise many types
                if plan.span_field < 0:  # only the span can meet bad bytes
                    raise
                start = int(self.scan.starts[i, plan.span_field])
                raise self._bad_span(start, exc, label) from None
            if got is not SLOW:
                return got  # type: ignore[no-any-return]
        out = self._execute(plan, i, label)
        if self.verify:
            self._check_same([label])
        self._bounded([out], [label])
        return out

    def many(self, items: list[int], labels: list[int]) -> list[tuple[Any, ...]]:
        """Samples ``items`` (in range, offset order; errors naming ``labels``), identity checked
        after: under :data:`BATCH_READ_MIN`, or compiled whole with no arrays, one by one (one
        compiled call); else by field (arrays in one ``(n, ...)`` block, ints from a column)."""
        if not items:
            return []
        self.prefetch(items, labels)  # no descriptor (remote): the ranges go out together
        here, plan = self.opened()  # (settled after: its reads come from the prefetch's)
        if len(items) < BATCH_READ_MIN or not plan.by_field:
            return self._each(here.loader, plan, items, labels)
        out = self._by_field(here.loader, plan, items, labels)
        if self.verify:  # after the reads: a write that raced them has stamped the file by now
            self._check_same(labels)
        return self._bounded(out, labels)

    def prefetch(self, items: list[int], labels: list[int]) -> None:
        """Hint: ``items`` are read soon; a remote file fetches their ranges together now
        (before the file's plan is settled, the bytes settling it reads go with them: one
        round trip, not two in a row)."""
        here = self._here.get()
        if here.fd < 0 and items:
            ranges = fetch_ranges(self.scan, self._plan, self.general, items)
            try:
                self.source.prefetch(ranges)
            except PickleshardError as exc:  # named by the sample whose bytes it was reading
                at = getattr(exc, "offset", None)
                raise self._named(exc, self._label_at(at, items, labels)) from None

    def _label_at(self, offset: int | None, items: list[int], labels: list[int]) -> int | None:
        """The label of the sample of ``items`` whose bytes hold ``offset`` (None: none does)."""
        if offset is None:
            return None
        inside = (self.scan.starts[items] <= offset) & (offset < self.scan.ends[items])
        hits = np.flatnonzero(inside.any(axis=1))
        return labels[int(hits[0])] if len(hits) else None

    def _execute(self, plan: ReadPlan, i: int, label: int) -> tuple[Any, ...]:
        """Sample ``i`` read by ``plan`` in Python (the reference of the compiled reads), the
        file open in this process."""
        scan = self.scan
        starts = scan.starts[i].tolist()
        out: list[Any] = [None] * len(starts)
        spans: list[int] = []
        try:  # a refusal or a failed remote read, named by the sample it was for
            for f, reader in enumerate(plan.readers):
                s = starts[f]
                if reader is None or (isinstance(reader, ArrayItems) and not reader.direct(i, s)):
                    spans.append(f)
                else:
                    out[f] = reader.one(i, s, int(scan.ends[i, f]), label)
            if spans:
                self.spans.many(out, i, starts, spans, label, self._here.get().loader)
        except PickleshardError as exc:
            raise self._named(exc, label) from None
        return tuple(out)

    def _each(
        self, loader: Any, plan: ReadPlan, items: list[int], labels: list[int]
    ) -> list[tuple[Any, ...]]:
        """Samples ``items`` one by one: by one compiled call when the plan is compiled, else
        by :meth:`_execute` each; the identity checked once after."""
        if plan.compiled:
            fd = self._here.get().fd
            try:  # the compiled read checks the file's identity after the batch
                return loader.load_samples(fd, items, labels, self._fallback)  # type: ignore[no-any-return]
            except PickleshardError as exc:
                raise self._named(exc, labels[loader.at]) from None
            except Exception as exc:  # bad bytes make the unpickler raise many types
                if plan.span_field < 0:  # only the span can meet bad bytes
                    raise
                at = loader.at
                start = int(self.scan.starts[items[at], plan.span_field])
                raise self._bad_span(start, exc, labels[at]) from None
        got = [self._execute(plan, i, label) for i, label in zip(items, labels, strict=True)]
        if self.verify:
            self._check_same(labels)
        return self._bounded(got, labels)

    def _fallback(self, i: int, label: int) -> tuple[Any, ...]:
        """What the compiled batch read calls for a sample it declines."""
        assert self._plan is not None
        return self._execute(self._plan, i, label)

    def _by_field(
        self, loader: Any, plan: ReadPlan, items: list[int], labels: list[int]
    ) -> list[tuple[Any, ...]]:
        """:meth:`many` of a batch, field by field (see there), with this process's compiled
        ``loader`` (or None); samples that a field cannot read from its payloads are read by
        :meth:`_execute`."""
        cols: list[list[Any] | None] = [
            None if reader is None else reader.many(items, labels, loader)
            for reader in plan.readers
        ]
        whole = [
            k
            for f, col in enumerate(cols)
            if plan.hows[f] == ITEM and col is not None
            for k, v in enumerate(col)
            if v is None
        ]
        wholes = set(whole)
        spans = list(plan.spans)
        starts_l = self.scan.starts[items].tolist() if spans else None
        out: list[tuple[Any, ...]] = [()] * len(items)
        for k, (i, label) in enumerate(zip(items, labels, strict=True)):
            if k in wholes:
                out[k] = self._execute(plan, i, label)
                continue
            row = [None if c is None else c[k] for c in cols]
            if starts_l is not None:
                try:
                    self.spans.many(row, i, starts_l[k], spans, label, loader)
                except PickleshardError as exc:
                    raise self._named(exc, label) from None
            out[k] = tuple(row)
        return out
