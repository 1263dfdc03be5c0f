"""Scan a pickle file into per-sample byte spans, without unpickling it.

:func:`scan_file` walks the opcodes once (:func:`pickleshard.picklekit.walk.walk_opcodes`, which seeks
over every payload), matches the top-level object against the layouts of
:mod:`pickleshard.scan.layouts` with the same decisions and field names as
:func:`~pickleshard.scan.layouts.decode_layout`, and reports, for sample ``i`` and field ``f``:

- ``kinds[f] == "pickle"``: ``[starts[i, f], ends[i, f])`` holds the opcodes that push that
  element plus what follows it up to the next element (its MEMOIZE/PUT, maybe a FRAME header).
  ``PROTO p`` + those bytes without FRAME headers + ``STOP``, unpickled with MEMOIZE counting
  from memo id ``memo_base[i, f] - shift`` and its externals resolved, equals
  ``decode_layout(pickle.load(file)).columns[f][i]``. ``shift`` is ``records[r, 2]`` for the
  record ``r`` holding the span (memo *keys* number every memo definition of the file in order;
  a record's own memo id ``m`` has key ``m + shift``).
- ``kinds[f] == "array_row"``: the field is one numpy array pickled at protocol 3+ and
  ``[starts[i, f], ends[i, f])`` are the raw bytes of its row ``i`` (``arrays[f]`` gives dtype and
  row shape); ``memo_base`` is -1.
- The externals of span ``(i, f)`` are ``ext_keys[ext_offsets[k]:ext_offsets[k + 1]]`` with
  ``k = i * F + f``: memo keys its GETs name that were defined before its start, each defined in
  one element of :class:`SharedTable`.

A file holding several pickles one after another (one ``pickle.dump`` call each) is read as
*chunks* when every pickle is itself a recognised layout (layout ``appended_<layout>``; they must
all have the same layout and fields, and samples are concatenated in file order), and otherwise
as *one sample per pickle*: layout ``appended_samples`` (an exact tuple gives fields ``x``,
``y``, ``f2``...; any other object is the single field ``x``) or ``appended_dict_samples``
(exact dicts; fields are the first one's keys). ``pickle.load`` called once per pickle, with
these rules, is the reference for both: :func:`pickleshard.scan.records.decode_records`, which
also follows a ``layout=`` the user named (``"columns"``, ``"records"``, ``"file"``), judges the
ambiguity of an inferred one (:attr:`ScanResult.ambiguity`) and keeps a one-pickle dict's scalar
values as file metadata (:attr:`ScanResult.metadata`), as the scan does.

Not span-indexable (:class:`~pickleshard.errors.NotSpanIndexableError`, read the file whole):
protocols 0/1, persistent ids, out-of-band buffers, GETs of ids the pickle never stored (a
Pickler reused across dumps), a sample referring to the dataset's own containers, an array field
stored as protocol-2 text, in Fortran or permuted order or with object dtype, and any top-level
value whose type the scanner cannot establish without running code.

The package, by concern: :mod:`~pickleshard.scan.model` (the result and its stored form),
:mod:`~pickleshard.scan.dtypes` (the dtype codec), :mod:`~pickleshard.scan.layouts` (the layout
table, and decoding an unpickled object by it), :mod:`~pickleshard.scan.matching` (the same
decisions on the walker's nodes), :mod:`~pickleshard.scan.inspector` (evaluating spans without
running code), :mod:`~pickleshard.scan.externals` (memo-reference tables),
:mod:`~pickleshard.scan.fastpath` (fields read without unpickling), :mod:`~pickleshard.scan.rows`
(the compiled row pass: a file that is one list of flat rows, walked without a node per value)
and :mod:`~pickleshard.scan.scratch` (an index build's local files read with ``pread`` into one
reused buffer, not mapped).
"""

from __future__ import annotations

import os
from array import array
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import FieldLengthMismatchError, NotSpanIndexableError
from ..io import ByteSource, open_source, storage_read_bytes
from ..io.options import SourceOptions
from ..picklekit.gcpause import paused_gc
from ..picklekit.nodes import DICT, ITEMS, KIND, LIST, TUPLE, start_of
from ..picklekit.walk import resolve_engine, walk_opcodes
from ..picklekit.walker import Walked
from ..safety.audit.named import named_globals
from .access import fetched_since, scan_view
from .ambiguity import Ambiguity, judge
from .defaults import FieldFacts, appended_are_records, judge_one_sample, one_pickle_is_one_sample
from .externals import assemble, element_table
from .inspector import Inspector
from .layouts import (
    APPENDED,
    DICT_SAMPLES,
    LAYOUT_TABLE,
    SAMPLES,
    LayoutChoice,
    default_field_names,
)
from .matching import (
    Candidate,
    Field,
    NotLayout,
    dict_rows,
    facts_of,
    fields_of,
    leaves,
    node_kind,
    spans,
    structure,
)
from .model import ArrayItem, ArrayRow, IntItem, ScanResult
from .rows import walk_rows

__all__ = ["ENGINE", "ArrayItem", "ArrayRow", "IntItem", "ScanResult", "scan_bytes", "scan_file"]

# The opcode walker ``engine="auto"`` runs here: "compiled" when pickleshard._cscan is built.
ENGINE = resolve_engine("auto")


def _judge(layout: str, parts: list[tuple[tuple[str, ...], list[Field]]]) -> Ambiguity | None:
    """:func:`~pickleshard.scan.ambiguity.judge` on the scanned pickles' columns."""
    names, cols = parts[0]
    return judge(
        LAYOUT_TABLE.get(layout.removeprefix(APPENDED)),
        [len(cs[0].starts) if cs else 0 for _, cs in parts],
        [all(c.array is not None for c in cs) for _, cs in parts],
        deep=all(c.array is not None and c.array.row_shape for c in cols),
        width=len(names),
        elements=", ".join(
            f"{n} {c.array.row_shape} {c.array.dtype}" if c.array else f"{n} object"
            for n, c in zip(names, cols, strict=True)
        ),
    )


def _facts(cols: list[Field]) -> list[FieldFacts]:
    """The facts (:mod:`pickleshard.scan.defaults`) of one pickle's scanned columns."""
    return [
        FieldFacts("sequence", len(c.starts), 1)
        if c.array is None
        else FieldFacts("array", len(c.starts), 1 + len(c.array.row_shape))
        for c in cols
    ]


def _scan_chunks(
    buf: Any,
    w: Walked,
    stops: list[int],
    encoding: str,
    choice: LayoutChoice = "auto",
    cands: list[Candidate] | None = None,
    release: bool = True,
) -> ScanResult:
    if cands is None:
        cands = [structure(r, w.name, choice) for r in w.roots]
    table = element_table(w, [leaf for c in cands for leaf in leaves(c)])
    insp = Inspector(buf, w, table, encoding, release)
    found = facts_of(cands[0], insp) if choice == "auto" and len(cands) == 1 else None
    if found is not None and one_pickle_is_one_sample(*found):
        whole = _scan_samples(buf, w, stops, encoding, "", release)
        return replace(whole, ambiguity=judge_one_sample(found[0]))
    meta: dict[str, Any] | None = {} if len(cands) == 1 else None
    parts = [fields_of(c, insp, w.name, meta) for c in cands]
    names, cols = parts[0]
    for r, (c, (n, cs)) in enumerate(zip(cands, parts, strict=True)):
        if (
            c.layout != cands[0].layout
            or n != names
            or [x.array for x in cs] != [x.array for x in cols]
        ):
            raise NotSpanIndexableError(
                w.name,
                f"appended pickle #{r + 1} differs from the first in layout, fields or array types",
                offset=w.records[r][0],
            )
    if choice == "auto" and appended_are_records([_facts(cs) for _, cs in parts]):
        return _scan_samples(buf, w, stops, encoding, APPENDED, release)
    if len(parts) > 1:
        joined = [
            [
                np.concatenate([p[1][f].starts for p in parts]),
                np.concatenate([p[1][f].ends for p in parts]),
            ]
            for f in range(len(names))
        ]
        cols = [Field(st, en, cols[f].array) for f, (st, en) in enumerate(joined)]
    layout = cands[0].layout.name if len(parts) == 1 else APPENDED + cands[0].layout.name
    # The GETs are in the table now, and _scan no longer falls back to _scan_samples (which
    # builds its own table from them): let them go before the biggest temporaries.
    w.get_offs, w.get_keys = array("q"), array("q")
    result = assemble(w, table, insp, layout, names, cols)
    ambiguity = _judge(layout, parts) if choice == "auto" else None
    return replace(result, metadata=meta or {}, ambiguity=ambiguity)


def _scan_samples(
    buf: Any,
    w: Walked,
    stops: list[int],
    encoding: str,
    prefix: str = APPENDED,
    release: bool = True,
) -> ScanResult:
    first = w.roots[0]
    kind = (
        first[KIND] if type(first) is list and first[ITEMS] and first[KIND] in (TUPLE, DICT) else 0
    )
    if (
        not all(node_kind(r) == kind and len(r[ITEMS]) == len(first[ITEMS]) for r in w.roots)
        if kind == TUPLE
        else not all(node_kind(r) == kind for r in w.roots)
        if kind == DICT
        else False
    ):
        raise NotSpanIndexableError(w.name, "appended pickles are samples of different shapes")
    if kind:
        leaves = [spans(w.roots)]
    else:
        leaves = [(np.array([start_of(r) for r in w.roots], np.int64), np.array(stops, np.int64))]
    table = element_table(w, leaves)
    insp = Inspector(buf, w, table, encoding, release)
    if kind == DICT:
        names, cols = dict_rows(w.roots, insp, w.name)
        return assemble(w, table, insp, prefix + DICT_SAMPLES.name, names, cols)
    n = len(first[ITEMS]) if kind else 1
    starts, ends = (leaves[0][0].reshape(-1, n), leaves[0][1].reshape(-1, n))
    names = default_field_names(n)
    return assemble(
        w,
        table,
        insp,
        prefix + SAMPLES.name,
        names,
        [Field(starts[:, f], ends[:, f]) for f in range(n)],
    )


def _scan(
    buf: Any,
    size: int,
    name: str,
    encoding: str,
    engine: str,
    layout: LayoutChoice = "auto",
    release: bool = True,
) -> ScanResult:
    # The walk's nodes (a few lists per row of a file of objects) live until the match is done:
    # no collection may walk them in between (nothing here makes a cycle).
    with paused_gc():
        rows = walk_rows(buf, size, name, engine, layout, release)
        if rows is not None:  # one list of flat rows: no nodes (see pickleshard.scan.rows)
            w, cands = rows[0], [rows[1]]
        else:
            w, cands = walk_opcodes(buf, size, name, engine=engine, release=release), None
        # the audit's facts from this walk (no second walk of the file to list its globals),
        # taken before the match lets go of the walk's GETs (a global's operand may be a GET of
        # a stored string: numpy's second global in every protocol-4 pickle of an array)
        named = named_globals(buf, w) if w.global_ops else {}
        result = _scan_walked(buf, w, name, encoding, layout, cands, release)
    return replace(result, named_globals=named)


def _scan_walked(
    buf: Any,
    w: Walked,
    name: str,
    encoding: str,
    layout: LayoutChoice,
    cands: list[Candidate] | None = None,
    release: bool = True,
) -> ScanResult:
    """The result of walk ``w``: its roots matched, or ``cands`` (the row pass's) as they are."""
    stops = [end - 1 for _, end, _ in w.records]
    one = len(w.records) == 1
    if layout == "file" and not one:  # the whole-file load words the error
        raise NotSpanIndexableError(
            name, f"layout='file' but the file holds {len(w.roots)} pickles"
        )
    root = w.roots[0] if w.roots else None
    is_list = cands is not None or (type(root) is list and root[KIND] == LIST)
    if layout == "file" or (layout == "records" and not (one and is_list)):
        try:
            return _scan_samples(buf, w, stops, encoding, "" if one else APPENDED, release)
        except NotLayout as exc:
            raise NotSpanIndexableError(
                name, f"{exc}; not samples that can be read in place"
            ) from None
    try:
        return _scan_chunks(buf, w, stops, encoding, layout, cands, release)
    except (NotLayout, FieldLengthMismatchError) as exc:
        if one or layout != "auto":
            if isinstance(exc, FieldLengthMismatchError):
                raise
            raise NotSpanIndexableError(
                name, f"{exc}; not a layout that can be read in place"
            ) from None
    try:
        return _scan_samples(buf, w, stops, encoding, APPENDED, release)
    except NotLayout as exc:  # private: never past this module
        raise NotSpanIndexableError(name, f"{exc}; not samples that can be read in place") from None


def scan_file(
    path: str | os.PathLike[str] | ByteSource,
    *,
    encoding: str = "ASCII",
    engine: str = "auto",
    layout: LayoutChoice = "auto",
    options: SourceOptions | None = None,
) -> ScanResult:
    """Scan the pickle file at ``path`` (see the module docstring for what is reported).

    ``path`` is a path or URL (opened with :func:`pickleshard.io.open_source` and ``options``,
    closed after) or an open :class:`~pickleshard.io.ByteSource` (left open). The source is advised as
    :func:`pickleshard.scan.access.choose_pattern` decides, so a sparse scan fetches only the pages
    it examines. ``encoding`` decodes Python 2 ``str`` dict keys, as in :func:`pickle.load`.
    ``engine`` picks the opcode walker: ``"auto"`` (the compiled one when built, see
    :data:`ENGINE`), ``"compiled"`` or ``"python"`` (the reference); results and errors are the
    same. ``layout`` is what the user named (see
    :data:`~pickleshard.scan.layouts.LAYOUT_CHOICES`); the result's ``ambiguity`` and
    ``metadata`` are as :func:`~pickleshard.scan.records.decode_records` finds them.
    Raises :class:`~pickleshard.errors.NotSpanIndexableError` when the file must be read
    whole, and the other :class:`~pickleshard.errors.PickleshardError` classes for bad files.
    """
    source = path if isinstance(path, ByteSource) else open_source(path, options)
    # this thread's count: a thread reading the next file ahead (pickleshard.scan.ahead)
    # counts its own, handed over with what it read
    before = storage_read_bytes(thread=True)
    try:
        buf, release, ahead = scan_view(source)
        result = _scan(buf, source.size, source.name, encoding, engine, layout, release)
    finally:  # the source's map goes with it
        if source is not path:
            source.close()
    fetched = fetched_since(before, thread=True)
    if fetched is not None and ahead is not None:
        fetched += ahead
    return replace(result, bytes_fetched=fetched)


def scan_bytes(
    data: bytes,
    name: str = "<bytes>",
    *,
    encoding: str = "ASCII",
    engine: str = "auto",
    layout: LayoutChoice = "auto",
) -> ScanResult:
    """:func:`scan_file` over bytes in memory; ``name`` is used in errors and as ``path``."""
    return _scan(data, len(data), name, encoding, engine, layout)
