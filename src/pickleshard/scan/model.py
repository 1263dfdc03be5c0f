"""What a scan reports: :class:`ScanResult` (the spans of every sample of one file) and how to
read a field's samples without unpickling them (:class:`ArrayRow`, :class:`ArrayItem`,
:class:`IntItem`), with their stored (JSON + ``.npy``) form.

What the spans mean is the contract of :mod:`pickleshard.scan`; a stored form read back from an
index is untrusted input, and :meth:`ArrayItem.from_json` checks that its template holds together.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..picklekit import opcodes as oc
from ..picklekit.memotables import SharedTable
from .ambiguity import Ambiguity
from .dtypes import dtype_from_json, dtype_to_json

__all__ = ["ARRAYS", "FORMAT", "MAX_TEMPLATE", "ArrayItem", "ArrayRow", "IntItem", "ScanResult"]

FORMAT = 1  # version of the stored form
MAX_TEMPLATE = 512  # bytes of an array item's template span outside its payload


@dataclass(frozen=True)
class ArrayRow:
    """How to read one row of an ``array_row`` field: ``row_shape`` items of ``dtype``, whose
    bytes are stored byte-swapped when ``swap`` (numpy < protocol 5 loads such arrays native)."""

    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    swap: bool = False

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64))

    def to_json(self) -> dict[str, Any]:
        descr = dtype_to_json(self.dtype)
        return {"descr": descr, "row_shape": list(self.row_shape), "swap": self.swap}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ArrayRow:
        dtype = dtype_from_json(obj["descr"])
        return cls(dtype, tuple(obj["row_shape"]), bool(obj["swap"]))


@dataclass(frozen=True)
class ArrayItem:
    """How to read the samples of a ``pickle`` field whose elements are numpy arrays straight
    from their payloads, without unpickling: ``shape`` items of ``dtype`` (swapped from the stored
    order when ``swap``, read-only when ``readonly``, as :func:`pickle.load` leaves them) starting
    ``prefix`` bytes after the span's start. The samples in ``exceptions`` (sorted) are read by
    unpickling their span instead.

    The framing the scan proved every other sample has: ``head`` (the ``prefix`` bytes before
    the payload: opcodes, dtype and shape GETs, the payload's length) and ``tail`` (the bytes
    after it up to the span's end), equal in every such sample except the ``[lo, hi)`` ranges of
    ``head_masked`` / ``tail_masked`` (memo PUT ids, numbered per sample); a span 9 bytes longer
    holds one FRAME header at one of the ``bounds`` of ``tail``. A reader that reads the payload
    in place checks these bytes (:meth:`framing_matches`): the file's bytes changed if they
    differ."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    swap: bool
    readonly: bool
    prefix: int
    exceptions: tuple[int, ...]
    head: bytes
    tail: bytes
    head_masked: tuple[tuple[int, int], ...]
    tail_masked: tuple[tuple[int, int], ...]
    bounds: tuple[int, ...]

    def framing_matches(self, head: bytearray, tail: bytearray) -> bool:
        """Whether a sample's bytes before (``head``) and after (``tail``, to its span's end)
        its payload are the template's; ``head`` and ``tail`` may be changed (masked bytes)."""
        if len(tail) != len(self.tail):
            if len(tail) != len(self.tail) + 9:
                return False
            for b in self.bounds:  # the one FRAME header the pickler may have put here
                if tail[b] == oc.FRAME_OP and self.framing_matches(head, tail[:b] + tail[b + 9 :]):
                    return True
            return False
        for lo, hi in self.head_masked:
            head[lo:hi] = self.head[lo:hi]
        for lo, hi in self.tail_masked:
            tail[lo:hi] = self.tail[lo:hi]
        return head == self.head and tail == self.tail

    def to_json(self) -> dict[str, Any]:
        return {
            "descr": dtype_to_json(self.dtype),
            "shape": list(self.shape),
            "swap": self.swap,
            "readonly": self.readonly,
            "prefix": self.prefix,
            "exceptions": list(self.exceptions),
            "head": self.head.hex(),
            "tail": self.tail.hex(),
            "head_masked": [list(r) for r in self.head_masked],
            "tail_masked": [list(r) for r in self.tail_masked],
            "bounds": list(self.bounds),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ArrayItem:
        """The stored form back; ValueError when its template does not hold together (an
        index is untrusted input: the reader relies on these lengths)."""
        dtype = dtype_from_json(obj["descr"])
        head, tail = bytes.fromhex(obj["head"]), bytes.fromhex(obj["tail"])
        head_masked = tuple((int(lo), int(hi)) for lo, hi in obj["head_masked"])
        tail_masked = tuple((int(lo), int(hi)) for lo, hi in obj["tail_masked"])
        bounds = tuple(int(b) for b in obj["bounds"])
        item = cls(
            dtype,
            tuple(obj["shape"]),
            bool(obj["swap"]),
            bool(obj["readonly"]),
            int(obj["prefix"]),
            tuple(int(i) for i in obj["exceptions"]),
            head,
            tail,
            head_masked,
            tail_masked,
            bounds,
        )
        if (
            len(head) != item.prefix
            or not 0 < len(head) + len(tail) <= MAX_TEMPLATE
            or not all(0 <= lo < hi <= len(head) for lo, hi in head_masked)
            or not all(0 <= lo < hi <= len(tail) for lo, hi in tail_masked)
            or not all(0 <= b <= len(tail) for b in bounds)
        ):
            raise ValueError("an array item's framing template does not fit its prefix")
        return item


@dataclass(frozen=True)
class IntItem:
    """A ``pickle`` field whose every span is one ``BININT1``/``BININT2``/``BININT`` opcode
    (maybe followed by a FRAME header): its values are decoded from those few bytes."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": "int"}


def _item_from_json(obj: dict[str, Any] | None) -> ArrayItem | IntItem | None:
    """An item back from the stored form; None for an array item stored without the framing
    template (no check possible: its samples are read by span)."""
    if obj is None:
        return None
    if obj.get("kind") == "int":
        return IntItem()
    return ArrayItem.from_json(obj) if "head" in obj else None


@dataclass(frozen=True)
class ScanResult:
    """The spans of every sample of one file; see the module docstring for what they mean.

    Per sample (shape ``(N, F)``, int64): ``starts``, ``ends``, ``memo_base``. CSR externals:
    ``ext_offsets`` (``N * F + 1``) and ``ext_keys``. Per file: ``records`` (``(R, 3)`` int64:
    start, end after STOP, memo-key shift of each pickle in the file), ``shared`` and the rest.
    ``bytes_read`` is how many bytes of the file the scan examined; ``bytes_fetched`` how many
    storage delivered to the scanning process meanwhile (readahead included; None where not
    measured: ``/proc/self/io`` missing, or bytes scanned). ``metadata`` (a one-pickle dict's
    scalar values) and ``ambiguity`` (the other plausible reading under ``layout="auto"``) are
    what :func:`~pickleshard.scan.records.decode_records` would find; the index keeps them in
    its files table, so a result rebuilt from the stored form has neither. ``engine`` is the opcode
    walker that ran ("compiled" or "python"; empty when rebuilt from the stored form); it takes
    no part in comparisons, since both give equal results.
    """

    path: str
    size: int
    protocol: int
    layout: str
    fields: tuple[str, ...]
    kinds: tuple[str, ...]
    arrays: tuple[ArrayRow | None, ...]
    starts: np.ndarray
    ends: np.ndarray
    memo_base: np.ndarray
    ext_offsets: np.ndarray
    ext_keys: np.ndarray
    records: np.ndarray
    shared: SharedTable
    bytes_read: int
    engine: str = field(default="", compare=False)
    items: tuple[ArrayItem | IntItem | None, ...] = ()
    bytes_fetched: int | None = field(default=None, compare=False)
    # per-file facts the index keeps in its files table, not in the stored scan
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)
    ambiguity: Ambiguity | None = field(default=None, compare=False)
    # opcodes naming a global the walk met (-1: not counted): 0 means nothing for the audit
    global_ops: int = field(default=-1, compare=False)
    # the globals the walk saw named, as the audit's walk would list them (see
    # safety.audit.named); None: the walk's facts did not settle it, or no walk gave them
    named_globals: dict[tuple[str, str], int] | None = field(default=None, compare=False)

    @property
    def num_samples(self) -> int:
        return int(self.starts.shape[0])

    def externals(self, i: int, f: int) -> np.ndarray:
        k = i * len(self.fields) + f
        return self.ext_keys[self.ext_offsets[k] : self.ext_offsets[k + 1]]

    def meta(self) -> dict[str, Any]:
        """The per-file part, JSON-serialisable (the per-sample part is :meth:`arrays_dict`)."""
        plain = {k: getattr(self, k) for k in ("size", "protocol", "layout", "bytes_read")}
        if self.bytes_fetched is not None:
            plain["bytes_fetched"] = self.bytes_fetched
        return {
            **plain,
            "format": FORMAT,
            "fields": list(self.fields),
            "kinds": list(self.kinds),
            "arrays": [a.to_json() if a is not None else None for a in self.arrays],
            "items": [a.to_json() if a is not None else None for a in self.items],
            "shared": self.shared.to_json(),
        }

    def arrays_dict(self) -> dict[str, np.ndarray]:
        """The numpy arrays to store as ``.npy``: the per-sample ones, and ``records``."""
        return {n: getattr(self, n) for n in ARRAYS}

    @classmethod
    def from_stored(
        cls, path: str | os.PathLike[str], meta: dict[str, Any], arrays: dict[str, np.ndarray]
    ) -> ScanResult:
        """Rebuild from :meth:`meta` (after a JSON round trip) and :meth:`arrays_dict` (mmaps
        are fine); raises ``ValueError`` for a ``meta`` of another format version."""
        if meta.get("format") != FORMAT:
            raise ValueError(f"scan format {meta.get('format')!r}, expected {FORMAT}")
        plain: dict[str, Any] = {k: meta[k] for k in ("size", "protocol", "layout", "bytes_read")}
        return cls(
            path=os.fspath(path),
            fields=tuple(meta["fields"]),
            kinds=tuple(meta["kinds"]),
            arrays=tuple(ArrayRow.from_json(a) if a else None for a in meta["arrays"]),
            items=tuple(_item_from_json(a) for a in meta.get("items", ())),
            shared=SharedTable.from_json(meta["shared"]),
            starts=arrays["starts"],
            ends=arrays["ends"],
            memo_base=arrays["memo_base"],
            ext_offsets=arrays["ext_offsets"],
            ext_keys=arrays["ext_keys"],
            records=arrays["records"],
            bytes_fetched=meta.get("bytes_fetched"),
            **plain,
        )


ARRAYS = ("starts", "ends", "memo_base", "ext_offsets", "ext_keys", "records")
