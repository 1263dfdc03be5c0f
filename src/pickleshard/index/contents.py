"""What the index's arrays hold, checked against its (checked) files table, as untrusted input.

:func:`check_arrays` checks what the readers rely on, vectorised over all rows of all files at
once (a few passes over each array, no Python loop per sample; loops per file only for array
fields):

- ``samples`` numbers each file's samples ``0..n-1``, file after file;
- each file's pickles (``records``) lie in order inside the file, their memo shifts in range;
- per field, spans follow one another in file order without overlapping (a swapped or moved row
  breaks the order), inside the file's first and last pickle, or inside one pickle each when
  the file holds several; spans read by unpickling are not empty;
- memo bases are ``-1`` for array rows, else in ``[0, start]``, and grow no faster than the
  starts do (each memo definition takes at least one byte);
- CSR offsets grow from 0 to ``len(ext_keys)``, continuing from file to file; a span's externals
  are below its memo base and keys of its file's shared table (their order within a span does
  not matter to a reader: it maps each key to its own prologue slot); array rows have none;
- span lengths match how each field is read: an array row is exactly its bytes, a small int one
  opcode (and maybe a FRAME header), a per-sample array its prefix + payload + template tail.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..picklekit import opcodes as oc
from ..scan.model import MAX_TEMPLATE as _MAX_TEMPLATE
from .checking import INT, ITEM, PICKLE, ROW, FieldCheck, IndexProblem
from .files import FileEntry
from .ondisk import SPAN_ARRAYS

__all__ = ["check_arrays"]

_FRAME = 9  # bytes of a FRAME header a span may end with
_INT_OK = np.zeros(16, bool)  # span lengths of one small-int opcode, maybe + a FRAME header
_INT_OK[[n + k for n in oc.INT_SPAN.values() for k in (0, _FRAME)]] = True


class _Files:
    """Per span file: its rows, size, pickles, and how each field is read."""

    def __init__(self, span: list[FileEntry], checks: list[tuple[FieldCheck, ...]], nf: int):
        self.span, self.checks, self.nf = span, checks, nf
        self.counts = np.array([f.num_samples for f in span], np.int64)
        self.sizes = np.array([f.size for f in span], np.int64)
        self.nrec = np.array([int((f.scan or {})["num_records"]) for f in span], np.int64)
        self.first_row = np.concatenate([[0], np.cumsum(self.counts)])
        self.first_rec = np.concatenate([[0], np.cumsum(self.nrec)])
        self.how = np.array([[c.how for c in fc] for fc in checks], np.int8).reshape(-1, nf)
        self.nonempty = np.flatnonzero(self.counts)  # files with rows (reduceat needs them)
        # offsets made global by adding the sizes of the files before (+1: never touching)
        self.bias = np.concatenate([[0], np.cumsum(self.sizes + 1)])[:-1]

    def boundaries(self, rows: int) -> np.ndarray:
        """The rows (other than 0) where a file's rows begin."""
        b = self.first_row[1:-1]
        return b[(b > 0) & (b < rows)]

    def file_of(self, row: int) -> int:
        return int(np.searchsorted(self.first_row, row, "right")) - 1

    def problem(self, name: str, row: int, f: int, st: Any, en: Any, what: str) -> IndexProblem:
        s = self.file_of(row)
        e = self.span[s]
        return IndexProblem(
            name,
            f"row {row} (sample {row - int(self.first_row[s])}, field {f} of {e.path}, a file "
            f"of {e.size} bytes): span [{int(st[row, f])}, {int(en[row, f])}) {what}",
        )


def check_arrays(
    files: list[FileEntry],
    checks: list[tuple[FieldCheck, ...]],
    nf: int,
    arrays: dict[str, np.ndarray],
    names: dict[str, str],
) -> None:
    """Check the arrays' contents against the checked files table (``checks``: per span file,
    per field, from :func:`pickleshard.index.validate.check_header`); raises ``IndexProblem``."""
    _check_samples(files, np.asarray(arrays["samples"]), names["samples"])
    span = [f for f in files if f.mode == "span"]
    if not span:
        return
    a = {k: np.asarray(arrays[k]) for k in SPAN_ARRAYS}
    fs = _Files(span, checks, nf)
    _check_records(fs, a["records"], names["records"])
    if len(a["starts"]):
        _check_spans(fs, a, names)
        _check_memo(fs, a, names)
        _check_lengths(fs, a, names)
    _check_externals(fs, a, names)


def _first(bad: np.ndarray) -> tuple[int, ...]:
    return tuple(int(x) for x in np.unravel_index(int(np.argmax(bad)), bad.shape))


def _check_samples(files: list[FileEntry], samples: np.ndarray, name: str) -> None:
    """``samples`` numbers each file's samples 0..n-1, file after file."""
    counts = np.array([f.num_samples for f in files], np.int64)
    file = np.repeat(np.arange(len(files), dtype=np.uint32), counts)
    item = np.arange(len(file), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    bad = (samples["file"] != file) | (samples["item"] != item)
    if bad.any():
        r = int(np.argmax(bad))
        got = (int(samples["file"][r]), int(samples["item"][r]))
        raise IndexProblem(name, f"row {r} is {got}, expected {(int(file[r]), int(item[r]))}")


def _check_records(fs: _Files, rec: np.ndarray, name: str) -> None:
    """Each file's pickles: inside the file, in order, not overlapping; memo shifts in range
    (a memo key minus an id: at most the start, at least minus the file's size)."""
    size = np.repeat(fs.sizes, fs.nrec)
    start, end, shift = rec[:, 0], rec[:, 1], rec[:, 2]
    bad = (start < 0) | (end <= start) | (end > size) | (shift < -size) | (shift > start)
    bad[1:] |= start[1:] < end[:-1]  # overlapping the previous pickle: within a file only
    b = fs.first_rec[1:-1]
    b = b[(b > 0) & (b < len(rec))]
    bad[b] = (
        (start < 0)[b]
        | (end <= start)[b]
        | (end > size)[b]
        | (shift < -size)[b]
        | (shift > start)[b]
    )
    if bad.any():
        q = int(np.argmax(bad))
        e = fs.span[int(np.searchsorted(fs.first_rec, q, "right")) - 1]
        raise IndexProblem(
            name,
            f"row {q} ({e.path}, a file of {e.size} bytes): pickle (start, end, memo shift) "
            f"{tuple(int(v) for v in rec[q])} is out of order or outside the file",
        )
    if ((fs.nrec == 0) & (fs.counts > 0)).any():
        raise IndexProblem(name, "a file with samples has no pickles")


def _check_spans(fs: _Files, a: dict[str, np.ndarray], names: dict[str, str]) -> None:
    """Per field, spans in file order without overlap, non-empty when unpickled, inside the
    file's pickles."""
    st, en = a["starts"], a["ends"]
    name = names["starts"]
    length = en - st
    if int(length.min()) < 0:
        r, f = _first(length < 0)
        raise fs.problem(name, r, f, st, en, "ends before it starts")
    gap = st[1:] - en[:-1]  # >= 0 within a file: the next span starts after this one ends
    gap[fs.boundaries(len(st)) - 1] = 0  # across files: anything
    if len(gap) and int(gap.min()) < 0:
        r, f = _first(gap < 0)
        raise fs.problem(
            name, r + 1, f, st, en, "starts before the previous sample's ends (rows out of order)"
        )
    ne = fs.nonempty
    shortest = np.minimum.reduceat(length, fs.first_row[ne], axis=0)  # (files with rows, F)
    bad = (shortest == 0) & (fs.how[ne] != ROW)
    if bad.any():
        s, f = _first(bad)
        r = int(fs.first_row[ne[s]]) + int(np.argmax(length[fs.first_row[ne[s]] :, f] == 0))
        raise fs.problem(name, r, f, st, en, "is empty")
    # in order per field: every span lies between the file's first start and last end
    rec = a["records"]
    lo = st[fs.first_row[ne]]
    hi = en[fs.first_row[ne + 1] - 1]
    rec_lo = rec[fs.first_rec[ne], 0][:, None]
    rec_hi = rec[fs.first_rec[ne + 1] - 1, 1][:, None]
    bad = (lo < rec_lo) | (hi > rec_hi)
    if bad.any():
        s, f = _first(bad)
        r = int(fs.first_row[ne[s]] if lo[s, f] < rec_lo[s, 0] else fs.first_row[ne[s] + 1] - 1)
        raise fs.problem(name, r, f, st, en, "is outside the file's pickles")
    multi = ne[fs.nrec[ne] > 1]  # files of several pickles: each span inside one of them
    if len(multi):
        rows = np.concatenate([np.arange(fs.first_row[s], fs.first_row[s + 1]) for s in multi])
        row_file = np.repeat(multi, fs.counts[multi])
        rec_file = np.repeat(np.arange(len(fs.span)), fs.nrec)
        bias = fs.bias[row_file][:, None]
        g_start = rec[:, 0] + fs.bias[rec_file]
        q = np.searchsorted(g_start, st[rows] + bias, "right") - 1
        bad = (rec_file[q] != row_file[:, None]) | (en[rows] > rec[q, 1])
        if bad.any():
            k, f = _first(bad)
            raise fs.problem(name, int(rows[k]), f, st, en, "is not inside one pickle")


def _check_memo(fs: _Files, a: dict[str, np.ndarray], names: dict[str, str]) -> None:
    """Memo bases: -1 for array rows; else in ``[0, start]``, growing by at most as many as
    the bytes between two starts (each memo definition is an opcode of at least one byte)."""
    st, en, mb = a["starts"], a["ends"], a["memo_base"]
    name = names["memo_base"]
    ne = fs.nonempty
    at = fs.first_row[ne]
    d = mb - st  # <= 0, and never growing within a file (for rows: -1 - start, decreasing)
    low, high, ahead = (
        np.minimum.reduceat(mb, at, axis=0),
        np.maximum.reduceat(mb, at, axis=0),
        np.maximum.reduceat(d, at, axis=0),
    )
    rows = fs.how[ne] == ROW
    bad = np.where(rows, (low != -1) | (high != -1), (low < 0) | (ahead > 0))
    step = np.zeros(mb.shape, bool)
    step[1:] = (mb[1:] < mb[:-1]) | (d[1:] > d[:-1])
    step[fs.boundaries(len(st))] = False  # across files: anything
    if bad.any() or step.any():
        if bad.any():
            s, f = _first(bad)
            lo, hi = int(fs.first_row[ne[s]]), int(fs.first_row[ne[s] + 1])
            wrong = (mb[lo:hi, f] != -1) if rows[s, f] else (mb[lo:hi, f] < 0) | (d[lo:hi, f] > 0)
            r = lo + int(np.argmax(wrong))
        else:
            r, f = _first(step)
        raise fs.problem(name, r, f, st, en, f"has memo base {int(mb[r, f])}, out of range")


def _check_lengths(fs: _Files, a: dict[str, np.ndarray], names: dict[str, str]) -> None:
    """Span lengths as each field is read: small ints, array rows, per-sample arrays; every
    file at once, field by field (the failing file's own check then words the message)."""
    st, en = a["starts"], a["ends"]
    length = en - st
    for f in range(fs.nf):
        kinds = fs.how[:, f]
        if (kinds == PICKLE).all():
            continue
        col = length[:, f]
        row_kind = np.repeat(kinds, fs.counts)
        bad = np.zeros(len(col), bool)
        if (kinds == INT).any():
            bad |= (row_kind == INT) & ~_INT_OK[np.minimum(col, 15)]
        if (kinds == ROW).any():
            want = np.array([c[f].nbytes for c in fs.checks], np.int64)
            bad |= (row_kind == ROW) & (col != np.repeat(want, fs.counts))
        if (kinds == ITEM).any():
            bad |= _items_bad(fs, f, col, row_kind == ITEM)
        if bad.any():
            r = int(np.argmax(bad))
            s = fs.file_of(r)
            lo, hi = int(fs.first_row[s]), int(fs.first_row[s + 1])
            _, what = _lengths_bad(fs.checks[s][f], col[lo:hi])
            raise fs.problem(names["ends"], r, f, st, en, what)


def _items_bad(fs: _Files, f: int, col: np.ndarray, is_item: np.ndarray) -> np.ndarray:
    """Rows of per-sample array field ``f`` whose span cannot hold prefix + payload + tail:
    every direct sample of a file is as long as its template (the shortest direct span when
    no template is stored), or 9 bytes longer (a FRAME header)."""
    checks = [c[f] for c in fs.checks]
    item = np.array([c.how == ITEM for c in checks])
    prefix = np.array([c.prefix for c in checks], np.int64)
    nbytes = np.array([c.nbytes for c in checks], np.int64)
    tail = np.array([c.tail for c in checks], np.int64)
    direct = is_item.copy()
    exceptions = [int(fs.first_row[s]) + e for s, c in enumerate(checks) for e in c.exceptions]
    direct[exceptions] = False
    least = prefix + nbytes + tail
    ne = fs.nonempty
    if len(ne) and bool((tail[ne] < 0).any()):  # no template: the shortest direct span
        shortest = np.minimum.reduceat(
            np.where(direct, col, np.iinfo(np.int64).max), fs.first_row[ne]
        )
        least[ne] = np.where(tail[ne] < 0, shortest, least[ne])
    no_room = item & ((least < prefix + nbytes) | (least - nbytes > _MAX_TEMPLATE))
    want = np.repeat(least, fs.counts)
    bad: np.ndarray = direct & (
        np.repeat(no_room, fs.counts) | ((col != want) & (col != want + _FRAME))
    )
    return bad


def _lengths_bad(check: FieldCheck, lens: np.ndarray) -> tuple[np.ndarray | None, str]:
    """Which of one file's span lengths of a field do not fit ``check``, and why."""
    if check.how == INT:
        ok = _INT_OK[np.minimum(lens, 15)]
        return (~ok if not ok.all() else None), "is not one small int"
    if check.how == ROW:
        bad = lens != check.nbytes
        return (bad if bad.any() else None), f"is not one {check.nbytes}-byte array row"
    direct = np.ones(len(lens), bool)
    direct[list(check.exceptions)] = False
    least = int(lens[direct].min())
    if check.tail >= 0:  # the template says the exact length
        least = check.prefix + check.nbytes + check.tail
    if least < check.prefix + check.nbytes or least - check.nbytes > _MAX_TEMPLATE:
        return direct, (f"has no room for its {check.nbytes}-byte array after {check.prefix} bytes")
    bad = direct & (lens != least) & (lens != least + _FRAME)
    return (bad if bad.any() else None), (
        f"is not {least} (or {least + _FRAME}) bytes long like the field's other arrays: "
        f"{check.prefix} + {check.nbytes}-byte payload + tail"
    )


def _check_externals(fs: _Files, a: dict[str, np.ndarray], names: dict[str, str]) -> None:
    """CSR offsets grow from 0 to the number of keys, continuing from file to file; a span's
    externals are keys of its file's shared table, below its memo base; array rows have
    none."""
    off, keys, mb = a["ext_offsets"], a["ext_keys"], a["memo_base"]
    name, kname = names["ext_offsets"], names["ext_keys"]
    nf = fs.nf
    step = np.diff(off)
    if off[0] != 0 or off[-1] != len(keys) or (len(step) and int(step.min()) < 0):
        raise IndexProblem(name, f"offsets do not grow from 0 to the {len(keys)} keys")
    last = np.cumsum(fs.counts * nf + 1) - 1  # each file's last offset is the next's first
    if len(fs.span) > 1 and bool((off[last[:-1]] != off[last[:-1] + 1]).any()):
        raise IndexProblem(name, "a file's offsets do not continue from the previous file's")
    if not len(keys):
        return
    n = np.delete(step, last[:-1]).reshape(-1, nf)  # (R, F) externals per span
    ne = fs.nonempty
    tables = [(f.scan or {})["shared"]["keys"] for f in fs.span]
    most = np.maximum.reduceat(n, fs.first_row[ne], axis=0) if len(ne) else n[:0]
    if bool((most[fs.how[ne] == ROW] != 0).any()):
        raise IndexProblem(name, "an array row has externals")
    # no more externals than the file's table has keys: a reader's prologue is that long
    sizes = np.array([len(t) for t in tables], np.int64)[ne]
    if bool((most.max(axis=1, initial=0) > sizes).any()):
        raise IndexProblem(name, "a span has more externals than its file's shared table keys")
    flat_n = n.reshape(-1)
    if int(keys.min()) < 0 or bool((keys >= np.repeat(mb.reshape(-1), flat_n)).any()):
        raise IndexProblem(kname, "a span's external is not a key defined before the span")
    per_file = off[last] - off[last - fs.counts * nf]
    ok = _in_tables(keys, per_file, tables, fs.bias)
    if not ok.all():
        k = int(np.argmax(~ok))
        raise IndexProblem(kname, f"key {k} ({int(keys[k])}) is not in its file's shared table")


_LOOKUP = 1 << 24  # entries of a membership lookup table (bools); wider key ranges: searchsorted


def _in_tables(
    keys: np.ndarray, per_file: np.ndarray, tables: list[list[int]], bias: np.ndarray
) -> np.ndarray:
    """Whether each of ``keys`` (``0 <= key``; the first ``per_file[0]`` are file 0's, and so
    on) is in its file's sorted table: through a lookup table over ``0..max`` (one for every
    file when their tables are equal, as files written alike have; else the files' ranges laid
    end to end), or a binary search of the keys moved by ``bias`` (per file, beyond the
    previous file's keys) when the ranges are too wide for a lookup table."""
    tops = np.array([t[-1] + 1 if t else 0 for t in tables], np.int64)  # keys of s: < tops[s]
    same = all(t == tables[0] for t in tables)
    if (int(tops[0]) if same else int(tops.sum())) <= _LOOKUP:
        if same:
            lookup = np.zeros(int(tops[0]) + 1, bool)  # + 1: where the keys past the top go
            lookup[tables[0]] = True
            found: np.ndarray = lookup[np.minimum(keys, int(tops[0]))]
            return found
        base = np.cumsum(tops) - tops
        lookup = np.zeros(int(tops.sum()) + 1, bool)
        for t, b in zip(tables, base.tolist(), strict=True):
            lookup[np.asarray(t, np.int64) + b] = True
        inside = keys < np.repeat(tops, per_file)
        return lookup[np.where(inside, keys + np.repeat(base, per_file), len(lookup) - 1)]
    table = np.concatenate(
        [np.asarray(t, np.int64) + b for t, b in zip(tables, bias.tolist(), strict=True)]
    )
    gk = keys + np.repeat(bias, per_file)
    at = np.minimum(np.searchsorted(table, gk), max(len(table) - 1, 0))
    return table[at] == gk if len(table) else np.zeros(len(keys), bool)
