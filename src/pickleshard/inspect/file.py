"""What is in a pickle file, and is it safe to load? Answered without loading it.

:func:`inspect_file` combines three readings of a file, none of which imports or calls anything
the file names:

1. the globals audit (:func:`pickleshard.safety.audit.files.audit_buffer`): protocol, number of pickles,
   every global referenced with its verdict, opcode counts;
2. the scanner (:func:`pickleshard.scan.scan_file`): layout, fields, sample count, and whether
   the samples can be read in place (and the scanner's reason when they cannot);
3. the inert unpickler (:class:`~pickleshard.safety.inert.InspectUnpickler`, the scanner's
   too) that evaluates the first few samples into stand-ins for a type/shape/dtype summary
   (:func:`~pickleshard.inspect.report.describe`): numpy arrays become
   :class:`~pickleshard.safety.standins.ArraySpec` (dtype and shape, payload skipped), every
   other global an :class:`~pickleshard.safety.standins.Opaque` that only remembers its name
   and what it was called with.

When the scanner cannot index a file (protocol 0/1, a layout it does not support, a pickled
model object...) the inert unpickler reads the whole file instead, if it has at most
:data:`WHOLE_FILE_OPCODES` opcodes; past that, layout and counts are "unknown without loading".
Time and bytes read are proportional to the opcodes, not to the payload bytes.
"""

from __future__ import annotations

import itertools
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import (
    CorruptPickleError,
    FileProblem,
    NotSpanIndexableError,
    PickleshardError,
    UnsupportedLayoutError,
)
from ..io import open_source
from ..io.compressed.source import CompressedSource
from ..io.options import SourceOptions
from ..picklekit.extent import extent
from ..picklekit.externals import ExternalMemos, MemoShifts
from ..picklekit.spanfile import SpanFile
from ..producers.joblibfile import joblib_note
from ..safety.allowlist import parse_allow_globals
from ..safety.audit.files import Audit, audit_buffer
from ..safety.audit.walk import COUNTED
from ..safety.bounds import DEFAULT_MAX_DEPTH, measure
from ..safety.inert import InspectUnpickler, NotInspectable
from ..safety.standins import ArraySpec, EncodedBytes, Refusals
from ..scan import ScanResult, scan_file
from ..scan.access import scan_buffer
from ..scan.layouts import LayoutChoice, decode_layout
from ..scan.records import decode_records, judge_chunks
from .report import FileReport, describe

__all__ = ["WHOLE_FILE_OPCODES", "FileReport", "inspect_file"]

WHOLE_FILE_OPCODES = 1_000_000
"""A file the scanner cannot index is evaluated whole (inertly) only up to this many opcodes."""
_WINDOW = 512
# a preview never builds a sample with a set or dict in more opcodes than this (payloads count as
# one): a set of 150,000 ints that hash alike takes hours to build; 8,192 a fraction of a second
PREVIEW_OPCODES_MAX = 8192
_HASHED_OPS = frozenset(b"\x8f\x90\x91}dsuR\x81\x92")  # sets, dicts, calls


def _message(exc: FileProblem) -> str:
    if isinstance(exc, NotSpanIndexableError):
        return exc.reason
    text = str(exc)
    prefix = f"{exc.path}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


class _Reader:
    """Inert evaluation of spans of one mapped file, counting the bytes it reads."""

    def __init__(self, buf: Any, protocol: int, encoding: str) -> None:
        self.buf, self.protocol, self.encoding = buf, protocol, encoding
        self.bytes_read = 0
        self.refusals = Refusals()  # shared by every span's unpickler

    def read_at(self, offset: int, n: int) -> bytes:
        return bytes(self.buf[offset : offset + n])

    def load(
        self, start: int, end: int, first_id: int = 0, resolve: Any = None
    ) -> tuple[Any, dict[int, Any]]:
        # a small window: a skipped payload is never fetched into the read-ahead buffer
        span = SpanFile(self.read_at, start, end, self.protocol, window=_WINDOW)
        u = InspectUnpickler(
            span,
            bytes_min=64,
            refusals=self.refusals,
            first_id=first_id,
            resolve=resolve or _no_external,
            encoding=self.encoding,
        )
        try:
            with warnings.catch_warnings():  # numpy's complaints about a hostile dtype's args
                warnings.simplefilter("ignore")
                return u.load(), dict(u.memo)
        finally:
            self.bytes_read += span.bytes_read


def _check_depth(value: Any, limit: int, what: str, sink: Refusals) -> None:
    """Note in ``sink`` a ``value`` nested deeper than ``limit`` (as the loader's bound)."""
    try:
        measure(value, None, limit)
    except Exception as exc:  # BoundExceeded: too deep, or containing itself
        if getattr(exc, "what", "") in ("depth", "cycle"):
            sink.note(f"{what} nests containers deeper than max_depth={limit}")


def _hash_flood(buf: Any, pos: int, end: int, limit: int) -> bool:
    """Whether ``buf[pos:end]`` holds more than ``limit`` opcodes (payloads stepped over) and
    builds a set or dict (or calls something, as protocol 2 writes ``set([...])``): what may
    hash ``limit`` items alike. Deep lists and big arrays are evaluated as before."""
    n, risky = 0, False
    while pos < end:
        risky = risky or buf[pos] in _HASHED_OPS
        n += 1
        if n > limit and risky:
            return True
        pos = extent(buf, pos, end)
        if pos < 0:  # damaged: the evaluation says how
            return False
    return False


def _no_external(memo_id: int) -> Any:
    raise NotInspectable(f"memo id {memo_id} is not defined before its use")


class _SpanPreview:
    """The first samples of a span-indexed file, each span evaluated with its memo externals
    (the elements defining them replayed once each, by the one external-memo resolver)."""

    def __init__(self, reader: _Reader, scan: ScanResult) -> None:
        self.reader, self.scan = reader, scan
        self.shifts = MemoShifts.of_records(scan.records)
        self.externals = ExternalMemos(self._element_of, self._replay)

    def _element_of(self, key: int) -> int:
        try:
            return self.scan.shared.element(key)
        except KeyError:
            return -1

    def _replay(self, e: int) -> dict[int, Any]:
        start, end, base, _ = self.scan.shared.elements[e]
        return self._load(start, end, base)[1]

    def _load(self, start: int, end: int, base: int) -> tuple[Any, dict[int, Any]]:
        shift = self.shifts.at(start)
        value, memo = self.reader.load(
            start, end, base - shift, lambda i: self.externals(i + shift)
        )
        return value, {i + shift: v for i, v in memo.items()}

    def sample(self, i: int, f: int) -> str:
        s = self.scan
        row = s.arrays[f]
        if row is not None:
            return f"ndarray {row.dtype} {row.row_shape}"
        start, end = int(s.starts[i, f]), int(s.ends[i, f])
        if _hash_flood(self.reader.buf, start, end, PREVIEW_OPCODES_MAX):
            return f"? (a set or dict in over {PREVIEW_OPCODES_MAX:,} opcodes: not evaluated)"
        try:
            value = self._load(start, end, int(s.memo_base[i, f]))[0]
        except Exception as exc:  # an inert reading that fails says so; it never runs code
            return f"? ({type(exc).__name__})"
        _check_depth(value, DEFAULT_MAX_DEPTH, f"sample {i}", self.reader.refusals)
        return describe(value)


def _as_ndarray(v: Any) -> Any:
    """ArraySpecs become zero-memory numpy arrays of the same dtype and shape (values fake) so
    that :func:`decode_layout` classifies them; containers are converted one level deep."""
    if isinstance(v, ArraySpec):
        dtype = v.dtype if v.dtype is not None else np.dtype(object)
        base = np.zeros(1, dtype)
        return np.lib.stride_tricks.as_strided(base, v.shape, (0,) * len(v.shape))
    if type(v) is list:
        return [_as_ndarray(x) if isinstance(x, ArraySpec) else x for x in v]
    if type(v) is tuple:
        return tuple(_as_ndarray(x) if isinstance(x, ArraySpec) else x for x in v)
    if type(v) is dict:  # bytes at protocol <= 2 (a label beside the columns) as bytes
        return {k: _as_ndarray(x) if isinstance(x, ArraySpec) else _plain(x) for k, x in v.items()}
    return v


def _plain(x: Any) -> Any:
    return bytes(x) if type(x) is EncodedBytes else x


Decoded = tuple[str, tuple[str, ...] | None, int | None, dict[str, list[str]]]


def _decode_whole(
    objs: list[Any], path: str, samples: int, layout: LayoutChoice, report: FileReport
) -> Decoded:
    """Layout, fields, sample count and preview of inertly unpickled records; their
    ambiguity and metadata go into ``report``."""
    objs = [_as_ndarray(o) for o in objs]
    top = objs[0]
    if (
        len(objs) == 1
        and layout in ("auto", "columns")
        and not isinstance(top, (list, tuple, dict))
    ):
        return f"unsupported: the top-level object is {describe(objs[0])}", None, None, {}
    try:
        if (
            len(objs) > 1
            and layout in ("auto", "columns")
            and all(_is_layout(o, path, layout) for o in objs)
        ):
            chunks = [decode_layout(o, path, choice=layout) for o in objs]
            names = chunks[0].fields
            if any(c.fields != names for c in chunks):
                return "unsupported: appended pickles with different fields", None, None, {}
            n = sum(c.num_samples for c in chunks)
            cols: Sequence[Iterable[Any]] = [
                itertools.chain.from_iterable([c.columns[f] for c in chunks])
                for f in range(len(names))
            ]
            name = f"appended_{chunks[0].layout}"
            if layout == "auto":
                report.ambiguity = judge_chunks(name, names, chunks)
        else:
            d = decode_records(objs, path, layout)
            names, n, cols, name = d.fields, d.num_samples, d.columns, d.layout
            report.ambiguity, report.metadata = d.ambiguity, _shown(d.metadata)
    except UnsupportedLayoutError as exc:
        return f"unsupported: {_message(exc).split('; expected')[0]}", None, None, {}
    preview = {
        name: [describe(v) for v in itertools.islice(col, samples)]
        for name, col in zip(names, cols, strict=True)
    }
    return name, names, n, preview


def _shown(metadata: dict[str, Any]) -> dict[str, str]:
    return {k: (r if len(r := repr(v)) <= 80 else r[:77] + "...") for k, v in metadata.items()}


def _is_layout(obj: Any, path: str, layout: LayoutChoice) -> bool:
    try:
        decode_layout(obj, path, choice=layout)
    except UnsupportedLayoutError:
        return False
    return True


def inspect_file(
    path: str | os.PathLike[str],
    *,
    encoding: str = "ASCII",
    allow_globals: Iterable[str] = (),
    samples: int = 3,
    check_all: bool = False,
    layout: LayoutChoice = "auto",
    storage_options: Mapping[str, Any] | None = None,
) -> FileReport:
    """Inspect one pickle file without loading it; see the module docstring.

    ``storage_options`` open a URL (``s3://...``: credentials, endpoint... as in pandas).

    ``check_all`` (``inspect --strict``) evaluates every sample inertly, not only the ``samples``
    previewed, and a file read whole however many opcodes it has: a refusal the loader would
    raise for any sample (an amplifying call, nesting past ``max_depth``) is then in
    :attr:`FileReport.refusals`. It costs a pure-Python pass over every opcode.

    ``allow_globals`` (``"module.name"`` strings, as everywhere) turns those globals' verdicts
    to "allowed". ``layout`` is what a file or record is, as :class:`~pickleshard.PickleDataset`
    takes it; with ``"auto"``, :attr:`FileReport.ambiguity` is the other plausible reading when
    there is one. ``encoding`` decodes Python 2 ``str`` as :func:`pickle.load` does. Raises the
    :class:`~pickleshard.errors.PickleshardError` classes for files that are not readable
    pickles (empty, truncated, not a pickle, lying lengths), naming the file and offset.
    """
    name = os.fspath(path)
    allowed = tuple(allow_globals)
    extra = parse_allow_globals(allowed)
    t0 = time.perf_counter()
    options = SourceOptions(storage_options)
    with open_source(name, options) as source:  # its map (the buffer) closes with it
        buf, size = scan_buffer(source), source.size
        try:
            audit = audit_buffer(buf, size, name)
        except CorruptPickleError as exc:  # a joblib.dump file says so
            raise joblib_note(exc, source) from None
        reader = _Reader(buf, audit.protocol, encoding)
        report = _report(
            name, buf, audit, reader, encoding, max(samples, 0), check_all, layout, options
        )
        if isinstance(source, CompressedSource):  # what follows is of the decompressed bytes
            report.compression = source.describe()
    report.globals = audit.globals(extra)
    report.allow_globals = allowed
    report.refusals = [
        f"BUILD on global {module}.{gname} at byte {pos} (a file may not change a function or "
        "class of the loading process)"
        for pos, (module, gname) in audit.builds_on_globals
    ] + reader.refusals.texts
    report.bytes_read += audit.bytes_read + reader.bytes_read
    report.seconds = time.perf_counter() - t0
    return report


def _report(
    name: str,
    buf: Any,
    audit: Audit,
    reader: _Reader,
    encoding: str,
    samples: int,
    check_all: bool = False,
    layout: LayoutChoice = "auto",
    options: SourceOptions | None = None,
) -> FileReport:
    report = FileReport(
        path=name,
        size=audit.size,
        protocol=audit.protocol,
        pickles=len(audit.records),
        layout="unknown without loading",
        fields=None,
        samples=None,
        span_indexable=False,
        reason=None,
        kinds=None,
        preview={},
        globals=[],
        opcodes=audit.opcodes,
        counts={k: audit.counts[k] for k in COUNTED if k in audit.counts},
        computed_calls=audit.computed_calls,
        bytes_read=0,
        seconds=0.0,
    )
    try:
        scan = scan_file(name, encoding=encoding, layout=layout, options=options)
    except (NotSpanIndexableError, UnsupportedLayoutError) as exc:
        report.reason = _message(exc)
    except PickleshardError:
        raise
    except Exception as exc:  # a scanner defect must not hide the audit: report it as a reason
        report.reason = f"the scanner failed ({type(exc).__name__}: {exc})"
    else:
        report.span_indexable = True
        report.layout, report.fields, report.kinds = scan.layout, scan.fields, scan.kinds
        report.samples = scan.num_samples
        report.ambiguity, report.metadata = scan.ambiguity, _shown(scan.metadata)
        report.bytes_read += scan.bytes_read
        preview = _SpanPreview(reader, scan)
        n = min(samples, scan.num_samples)
        report.preview = {
            f: [preview.sample(i, j) for i in range(n)] for j, f in enumerate(scan.fields)
        }
        if check_all:  # the rest only for their refusals
            for i in range(n, scan.num_samples):
                for j in range(len(scan.fields)):
                    preview.sample(i, j)
        return report
    if audit.opcodes > WHOLE_FILE_OPCODES and not check_all:
        report.layout += f" (over {WHOLE_FILE_OPCODES:,} opcodes to evaluate)"
        return report
    try:
        objs = [reader.load(start, end)[0] for start, end in audit.records]
        for k, obj in enumerate(objs):
            _check_depth(obj, DEFAULT_MAX_DEPTH + 2, f"pickle {k}", reader.refusals)
        decoded = _decode_whole(objs, name, samples, layout, report)
    except Exception as exc:  # the inert reading cannot establish the content; it ran nothing
        report.layout += f" ({type(exc).__name__}: {exc})"
        return report
    report.layout, report.fields, report.samples, report.preview = decoded
    return report
