"""What is in a pickle file, and is it safe to load? Answered without loading it.

:func:`inspect_file` combines three readings of a file, none of which imports or calls anything
the file names:

1. the globals audit (:func:`pickleshard.audit.audit_buffer`): protocol, number of pickles,
   every global referenced with its verdict, opcode counts;
2. the scanner (:func:`pickleshard.scan.scan_file`): layout, fields, sample count, and whether
   the samples can be read in place (and the scanner's reason when they cannot);
3. an inert unpickler (:class:`InertUnpickler`) that evaluates the first few samples into
   stand-ins for a type/shape/dtype summary: numpy arrays become
   :class:`~pickleshard.memo.ArraySpec` (dtype and shape, payload skipped), every other global a
   :class:`Stand` that only remembers its name and what it was called with.

When the scanner cannot index a file (protocol 0/1, a layout it does not support, a pickled
model object...) the inert unpickler reads the whole file instead, if it has at most
:data:`WHOLE_FILE_OPCODES` opcodes; past that, layout and counts are "unknown without loading".
Time and bytes read are proportional to the opcodes, not to the payload bytes.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .audit import COUNTED, Audit, GlobalUse, audit_buffer
from .bounds import DEFAULT_MAX_DEPTH, measure
from .errors import (
    FileProblem,
    NotSpanIndexableError,
    PickleshardError,
    UnsupportedLayoutError,
)
from .guards import CHECKS, check_call
from .io import open_source
from .layouts import decode_layout, decode_records
from .memo import ArraySpec, InspectUnpickler, NotInspectable, Payload, SpanFile, _Latin1Text
from .safety import Verdict, parse_allow_globals
from .scan import ScanResult, scan_file
from .scanio import scan_buffer

__all__ = ["WHOLE_FILE_OPCODES", "FileReport", "InertUnpickler", "Stand", "inspect_file"]

SCHEMA = 1
WHOLE_FILE_OPCODES = 1_000_000
"""A file the scanner cannot index is evaluated whole (inertly) only up to this many opcodes."""
_VERDICT_RANK: dict[str, int] = {"allowed": 0, "not allowed": 1, "dangerous": 2}
_TENSOR_REBUILDS = ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3")
_SETS = {"set", "frozenset"}
_WINDOW = 512


class Stand:
    """An inert stand-in for a global: its ``qualname``, and whether it was called (``made``)
    with which ``args``. Calling it, instantiating it, giving it state or items all yield or
    ignore stand-ins; nothing the file names is imported or run. A stand-in for a global with
    an argument check (:data:`pickleshard.guards.CHECKS`) runs the check on each call and
    notes a refusal in ``sink``, as loading would refuse it."""

    __slots__ = ("args", "key", "made", "qualname", "sink")
    key: tuple[str, str] | None
    sink: list[str] | None

    def __new__(cls, *args: Any, **kwargs: Any) -> Stand:
        obj = object.__new__(Stand)
        obj.key, obj.sink = None, None
        if isinstance(cls, Stand):  # NEWOBJ: ``cls.__new__(cls, *args)`` on a stand-in class
            obj.qualname, obj.args, obj.made = cls.qualname, args, True
            if cls.sink is not None and len(cls.sink) < _MAX_REFUSALS:
                # the loader hands out a guard, not a class, for a global with an argument check
                cls.sink.append(f"{cls.qualname}: NEWOBJ on a global that a pickle may only call")
        return obj

    def __init__(self, qualname: str = "?", args: tuple[Any, ...] = (), made: bool = False):
        self.qualname, self.args, self.made = qualname, args, made

    def __call__(self, *args: Any, **kwargs: Any) -> Stand:
        if self.key is not None and self.sink is not None:
            _check_inert(self.key, args, kwargs, self.sink)
        return Stand(self.qualname, args, True)

    def _ignore(self, *args: Any) -> None:
        return None

    __setstate__ = __setitem__ = append = extend = add = _ignore


def _checked_stand(key: tuple[str, str], sink: list[str]) -> Stand:
    stand = Stand(".".join(key))
    stand.key, stand.sink = key, sink
    return stand


class _LenStr(str):
    """A ``str`` of a skipped text payload's length, for the argument checks."""

    length = 0

    def __len__(self) -> int:
        return self.length


class _LenBytes(bytes):
    """``bytes`` of a skipped payload's length, for the argument checks."""

    length = 0

    def __len__(self) -> int:
        return self.length


def _checked_value(v: Any) -> Any:
    """What an inert value stands for, as far as an argument check looks: skipped payloads
    become ``str``/``bytes`` of their length."""
    kind: type[_LenStr] | type[_LenBytes]
    if isinstance(v, Payload):
        kind, n = (_LenStr if v.kind == "text" else _LenBytes), v.length
    elif isinstance(v, _EncodedText) and v.length >= 0:
        kind, n = _LenBytes, v.length
    else:
        return v
    out = kind()
    out.length = n
    return out


def _check_inert(
    key: tuple[str, str], args: tuple[Any, ...], kwargs: dict[str, Any], sink: list[str]
) -> None:
    why = check_call(key, tuple(_checked_value(a) for a in args), kwargs)
    if why is not None and len(sink) < _MAX_REFUSALS:
        sink.append(f"{'.'.join(key)}: {why}")


_MAX_REFUSALS = 20
_HARMLESS = frozenset({(m, n) for m in ("builtins", "__builtin__") for n in ("range", "slice")})


class InertUnpickler(InspectUnpickler):
    """:class:`~pickleshard.memo.InspectUnpickler` whose unknown globals keep their names.

    numpy's array reconstruction builds :class:`~pickleshard.memo.ArraySpec`; ``numpy.ndarray``
    itself is a stand-in (so a file cannot call it to allocate); ``numpy.dtype`` is real, and so
    are ``range`` and ``slice`` (lazy, so that a container fed a range is seen as loading sees
    it). Any other global is a :class:`Stand`. Calls the loader would refuse (the shared
    argument checks of :mod:`pickleshard.guards`) are noted in :attr:`refusals`.
    """

    _NUMPY: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        [("numpy", "dtype")]
        + [(f"{p}.numeric", "_frombuffer") for p in ("numpy.core", "numpy._core")]
    )
    _RECONSTRUCT: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        (f"{p}.multiarray", "_reconstruct") for p in ("numpy.core", "numpy._core")
    )

    def __init__(self, file: SpanFile, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self.refusals: list[str] = []

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        if key in self._NUMPY:
            return super().find_class(module, name)
        if key in _HARMLESS:
            return range if name == "range" else slice
        if key in self._RECONSTRUCT:
            return functools.partial(_reconstruct, key, self.refusals)
        if key == ("_codecs", "encode"):
            return functools.partial(_encode, self.refusals)
        if key in CHECKS:
            return _checked_stand(key, self.refusals)
        return Stand(f"{module}.{name}")


def _reconstruct(
    key: tuple[str, str], sink: list[str], cls: Any, shape: Any = None, typecode: Any = None
) -> Any:
    _check_inert(key, (cls, shape, typecode), {}, sink)
    is_ndarray = isinstance(cls, Stand) and cls.qualname == "numpy.ndarray"
    return ArraySpec() if is_ndarray else Stand("numpy.core.multiarray._reconstruct", (cls,), True)


class _EncodedText(_Latin1Text):
    """What ``_codecs.encode(text, "latin1")`` stands for: bytes (protocol <= 2), ``length``
    of them; numpy's protocol <= 2 array data is one."""

    def __init__(self, length: int) -> None:
        self.length = length


def _encode(sink: list[str], text: Any, encoding: str = "utf-8") -> _EncodedText:
    _check_inert(("_codecs", "encode"), (text, encoding), {}, sink)
    n = text.length if isinstance(text, Payload) else len(text) if isinstance(text, str) else -1
    return _EncodedText(n)


def describe(v: Any, depth: int = 0) -> str:
    """A short type/shape/dtype summary of an inertly unpickled value (``?`` when the stand-ins
    a hostile file built cannot be summarised)."""
    try:
        return _describe(v, depth)
    except Exception as exc:
        return f"? ({type(exc).__name__})"


def _describe(v: Any, depth: int) -> str:
    if isinstance(v, ArraySpec):
        return f"ndarray {v.dtype if v.dtype is not None else '?'} {v.shape}"
    if isinstance(v, np.ndarray):  # a stand-in array (see _as_ndarray): its values are not real
        return f"ndarray {v.dtype} {v.shape}"
    if isinstance(v, np.generic):
        return f"numpy.{type(v).__name__}"
    if isinstance(v, Stand):
        return _describe_stand(v)
    if isinstance(v, _EncodedText):
        return f"bytes len={v.length if v.length >= 0 else '?'}"
    if isinstance(v, Payload):
        return f"{'str' if v.kind == 'text' else v.kind} len={v.length}"
    if isinstance(v, (list, tuple, dict, set, frozenset)):
        text = f"{type(v).__name__} len={len(v)}"
        if v and depth == 0:
            first = next(iter(v.values() if isinstance(v, dict) else v))
            key = f"{next(iter(v))!r}: " if isinstance(v, dict) else ""
            text += (
                f" ({key}{describe(first, 1)}, ...)"
                if len(v) > 1
                else f" ({key}{describe(first, 1)})"
            )
        return text
    if isinstance(v, (bytes, bytearray)):
        return f"{type(v).__name__} len={len(v)}"
    if isinstance(v, (str, int, float, complex, bool)) or v is None:
        text = repr(v)
        return f"{type(v).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(v, np.dtype):
        return f"numpy.dtype {v}"
    return type(v).__name__


def _describe_stand(v: Stand) -> str:
    module, _, name = v.qualname.rpartition(".")
    if not v.made:
        return f"global {v.qualname}"
    args = v.args
    if module == "torch._utils" and name in _TENSOR_REBUILDS and len(args) >= 3:
        shape = tuple(args[2]) if isinstance(args[2], tuple) else "?"
        return f"torch.Tensor shape {shape} (dtype unknown without loading)"
    if module == "torch._utils" and name.startswith("_rebuild_parameter") and args:
        return f"torch.nn.Parameter of {describe(args[0], 1)}"
    if module in ("builtins", "__builtin__") and name in _SETS and args:
        n = len(args[0]) if isinstance(args[0], (list, tuple)) else "?"
        return f"{name} len={n}"
    return f"{v.qualname}(...)"


@dataclass
class FileReport:
    """What :func:`inspect_file` found; see the module docstring. ``fields`` and ``samples`` are
    None when unknown without loading; ``reason`` says why a file is not span-indexable;
    ``refusals`` what loading would refuse although every global is allowed (``BUILD`` on a
    global, an amplifying call, a sample nested too deep), as ``--strict`` reports it."""

    path: str
    size: int
    protocol: int
    pickles: int
    layout: str
    fields: tuple[str, ...] | None
    samples: int | None
    span_indexable: bool
    reason: str | None
    kinds: tuple[str, ...] | None
    preview: dict[str, list[str]]
    globals: list[GlobalUse]
    opcodes: int
    counts: dict[str, int]
    computed_calls: int
    bytes_read: int
    seconds: float
    allow_globals: tuple[str, ...] = field(default=())
    refusals: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict | None:
        """The worst verdict among the globals (None when the file names none)."""
        worst: Verdict | None = None
        for g in self.globals:
            if worst is None or _VERDICT_RANK[g.verdict] > _VERDICT_RANK[worst]:
                worst = g.verdict
        return worst

    @property
    def unsafe(self) -> list[GlobalUse]:
        """Globals that are not allowed or are dangerous (what ``--strict`` fails on)."""
        return [g for g in self.globals if g.verdict != "allowed"]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "path": self.path,
            "size": self.size,
            "protocol": self.protocol,
            "pickles": self.pickles,
            "layout": self.layout,
            "fields": list(self.fields) if self.fields is not None else None,
            "samples": self.samples,
            "counts": dict.fromkeys(self.fields or (), self.samples),
            "span_indexable": self.span_indexable,
            "reason": self.reason,
            "kinds": list(self.kinds) if self.kinds is not None else None,
            "preview": self.preview,
            "globals": [g.to_json() for g in self.globals],
            "verdict": self.verdict,
            "opcodes": {"total": self.opcodes, **self.counts},
            "computed_calls": self.computed_calls,
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 6),
            "allow_globals": list(self.allow_globals),
            "refusals": list(self.refusals),
        }


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
        self.refusals: list[str] = []

    def read_at(self, offset: int, n: int) -> bytes:
        return bytes(self.buf[offset : offset + n])

    def load(
        self, start: int, end: int, first_id: int = 0, resolve: Any = None
    ) -> tuple[Any, dict[int, Any]]:
        # a small window: a skipped payload is never fetched into the read-ahead buffer
        span = SpanFile(self.read_at, start, end, self.protocol, window=_WINDOW)
        u = InertUnpickler(
            span,
            bytes_min=64,
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
            self.refusals += [r for r in u.refusals if r not in self.refusals]


def _check_depth(value: Any, limit: int, what: str, sink: list[str]) -> None:
    """Note in ``sink`` a ``value`` nested deeper than ``limit`` (as the loader's bound)."""
    try:
        measure(value, None, limit)
    except Exception as exc:  # bounds._Exceeded: too deep, or containing itself
        if getattr(exc, "what", "") in ("depth", "cycle") and len(sink) < _MAX_REFUSALS:
            sink.append(f"{what} nests containers deeper than max_depth={limit}")


def _no_external(memo_id: int) -> Any:
    raise NotInspectable(f"memo id {memo_id} is not defined before its use")


class _SpanPreview:
    """The first samples of a span-indexed file, each span evaluated with its memo externals."""

    def __init__(self, reader: _Reader, scan: ScanResult) -> None:
        self.reader, self.scan = reader, scan
        self.memos: dict[int, dict[int, Any] | None] = {}

    def _shift(self, start: int) -> int:
        row = int(np.searchsorted(self.scan.records[:, 0], start, "right")) - 1
        return int(self.scan.records[row, 2])

    def _load(self, start: int, end: int, base: int) -> tuple[Any, dict[int, Any]]:
        shift = self._shift(start)
        value, memo = self.reader.load(
            start, end, base - shift, lambda i: self._external(i + shift)
        )
        return value, {i + shift: v for i, v in memo.items()}

    def _external(self, key: int) -> Any:
        e = self.scan.shared.element(key)
        if e in self.memos and self.memos[e] is None:
            raise NotInspectable(f"memo key {key} refers to its own element")
        memo = self.memos.get(e)
        if memo is None:
            self.memos[e] = None
            start, end, base, _ = self.scan.shared.elements[e]
            memo = self.memos[e] = self._load(start, end, base)[1]
        return memo[key]

    def sample(self, i: int, f: int) -> str:
        s = self.scan
        row = s.arrays[f]
        if row is not None:
            return f"ndarray {row.dtype} {row.row_shape}"
        try:
            start, end = int(s.starts[i, f]), int(s.ends[i, f])
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
    if type(v) is dict:
        return {k: _as_ndarray(x) if isinstance(x, ArraySpec) else x for k, x in v.items()}
    return v


def _decode_whole(
    objs: list[Any], path: str, samples: int
) -> tuple[str, tuple[str, ...] | None, int | None, dict[str, list[str]]]:
    """Layout, fields, sample count and preview of inertly unpickled records."""
    objs = [_as_ndarray(o) for o in objs]
    if len(objs) == 1 and not isinstance(objs[0], (list, tuple, dict)):
        return f"unsupported: the top-level object is {describe(objs[0])}", None, None, {}
    try:
        if len(objs) > 1 and all(_is_layout(o, path) for o in objs):
            chunks = [decode_layout(o, path) for o in objs]
            names = chunks[0].fields
            if any(c.fields != names for c in chunks):
                return "unsupported: appended pickles with different fields", None, None, {}
            n = sum(c.num_samples for c in chunks)
            cols: Sequence[Iterable[Any]] = [
                itertools.chain.from_iterable([c.columns[f] for c in chunks])
                for f in range(len(names))
            ]
            layout = f"appended_{chunks[0].layout}"
        else:
            d = decode_records(objs, path)
            names, n, cols, layout = d.fields, d.num_samples, d.columns, d.layout
    except UnsupportedLayoutError as exc:
        return f"unsupported: {_message(exc).split('; expected')[0]}", None, None, {}
    preview = {
        name: [describe(v) for v in itertools.islice(col, samples)]
        for name, col in zip(names, cols, strict=True)
    }
    return layout, names, n, preview


def _is_layout(obj: Any, path: str) -> bool:
    try:
        decode_layout(obj, path)
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
) -> FileReport:
    """Inspect one pickle file without loading it; see the module docstring.

    ``check_all`` (``inspect --strict``) evaluates every sample inertly, not only the ``samples``
    previewed, and a file read whole however many opcodes it has: a refusal the loader would
    raise for any sample (an amplifying call, nesting past ``max_depth``) is then in
    :attr:`FileReport.refusals`. It costs a pure-Python pass over every opcode.

    ``allow_globals`` (``"module.name"`` strings, as everywhere) turns those globals' verdicts
    to "allowed". ``encoding`` decodes Python 2 ``str`` as :func:`pickle.load` does. Raises the
    :class:`~pickleshard.errors.PickleshardError` classes for files that are not readable
    pickles (empty, truncated, not a pickle, lying lengths), naming the file and offset.
    """
    name = os.fspath(path)
    allowed = tuple(allow_globals)
    extra = parse_allow_globals(allowed)
    t0 = time.perf_counter()
    with open_source(name) as source:  # its map (the buffer) closes with it
        buf, size = scan_buffer(source), source.size
        audit = audit_buffer(buf, size, name)
        reader = _Reader(buf, audit.protocol, encoding)
        report = _report(name, buf, audit, reader, encoding, max(samples, 0), check_all)
    report.globals = audit.globals(extra)
    report.allow_globals = allowed
    report.refusals = [
        f"BUILD on global {module}.{gname} at byte {pos} (a file may not change a function or "
        "class of the loading process)"
        for pos, (module, gname) in audit.builds_on_globals
    ] + reader.refusals
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
        scan = scan_file(name, encoding=encoding)
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
        decoded = _decode_whole(objs, name, samples)
    except Exception as exc:  # the inert reading cannot establish the content; it ran nothing
        report.layout += f" ({type(exc).__name__}: {exc})"
        return report
    report.layout, report.fields, report.samples, report.preview = decoded
    return report
