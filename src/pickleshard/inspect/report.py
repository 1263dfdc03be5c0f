"""What ``inspect`` reports of a file: :class:`FileReport` and its JSON, and :func:`describe`, the
short type/shape/dtype summary of an inertly unpickled value (stand-ins included) in its preview.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..safety.allowlist import Verdict
from ..safety.audit.files import GlobalUse
from ..safety.standins import ArraySpec, EncodedText, Opaque, Payload
from ..scan.ambiguity import Ambiguity

__all__ = ["SCHEMA", "FileReport", "describe"]

SCHEMA = 1
_VERDICT_RANK: dict[str, int] = {"allowed": 0, "not allowed": 1, "dangerous": 2}
_TENSOR_REBUILDS = ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3")
_SETS = {"set", "frozenset"}


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
    if isinstance(v, np.ndarray):  # a stand-in array (inspection._as_ndarray): values fake
        return f"ndarray {v.dtype} {v.shape}"
    if isinstance(v, np.generic):
        return f"numpy.{type(v).__name__}"
    if isinstance(v, Opaque):
        return _describe_stand(v)
    if isinstance(v, EncodedText):
        return f"bytes len={v.length if v.length >= 0 else '?'}"
    if isinstance(v, Payload):
        return f"{'str' if v.kind in ('text', 'string') else v.kind} len={v.length}"
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
    if isinstance(v, (bytes, bytearray)):  # EncodedBytes: bytes written as text
        return f"{'bytearray' if isinstance(v, bytearray) else 'bytes'} len={len(v)}"
    if isinstance(v, (str, int, float, complex, bool)) or v is None:
        text = repr(v)
        return f"{type(v).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(v, np.dtype):
        return f"numpy.dtype {v}"
    return type(v).__name__


def _describe_stand(v: Opaque) -> str:
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
    #: a compressed file's ``{"format", "compressed_size", "seek"}`` (``size``, ``opcodes``...
    #: are then of the decompressed stream); None for an uncompressed one
    compression: dict[str, Any] | None = None
    ambiguity: Ambiguity | None = None  # the other plausible reading of an inferred layout
    metadata: dict[str, str] = field(default_factory=dict)  # the file's metadata, shown

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
            "compression": self.compression,
            "ambiguity": self.ambiguity.to_json() if self.ambiguity else None,
            "metadata": dict(self.metadata),
        }
