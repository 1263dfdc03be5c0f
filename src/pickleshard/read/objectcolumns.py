"""Object fields decoded straight into a batch's columns, without building a sample.

A field read by span whose values keep to the common grammar (ints within int64, bools, floats,
str, bytes, None, and lists, tuples and dicts of these, with their memo ops, protocols 2-5) is
decoded by a stack machine that never builds the value: it emits the value's *shape* as tokens
(postfix: a leaf's kind; a list or dict opened, then each ``APPENDS``/``SETITEMS`` with its
count; a tuple with its count) and writes its leaves, in stream order, into slot ``j`` of the
batch's leaf table (``vals``: int64 ``(slots, B)``, a float as its bits, a bool as 0/1; ``objs``:
the str, bytes and None values). The first sample decoded sets the batch's shape; while every
later one gives the same tokens and dict keys the batch stays a table. A sample of another shape
makes the batch *ragged*: the rows decoded so far are built into their values, and from then on
each sample's value is built by the decoder as it is decoded (its tokens replayed on a stack,
still in the compiled call), handed out as they are and collated by ``default_collate`` (which
raises for ragged lists, as it does for the samples read one by one). A sample outside the
grammar makes the decoder decline, and that part of the batch is read the present way
(:meth:`SpanReader.many <pickleshard.read.SpanReader.many>`): never wrong data.

:class:`~pickleshard.read.objectdecoder.ReferenceDecoder` is the decoder in Python, the twin of
the compiled ``_cscan.ObjectDecoder`` (same tokens, leaves, sizes and answers); :class:`ObjectColumn` turns a
decoder's table into the values (``batch[k]``) or straight into what ``default_collate`` gives
for them (:meth:`ObjectColumn.collated`); :class:`ObjectFill` is one file's part of a batch read.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any

import numpy as np

from ..errors import PickleshardError
from ..io.local import map_readonly
from ..picklekit.compiled import CORE, require
from ..picklekit.externals import UnresolvableMemoId
from .ints import IntColumn
from .objectdecoder import (
    APPENDS,
    BOOL,
    DICT,
    FLOAT,
    INT_,
    LIST,
    NONE,
    OD_EXTERNAL,
    OD_OK,
    SHIFT,
    TUPLE,
)
from .plan import INT, SPAN, ReadPlan
from .reader import Opened, SpanReader

__all__ = ["NotCollatable", "ObjectColumn", "ObjectFill", "decode_objects", "shape_tree"]


# -- the shape as a tree, and what default_collate makes of it ---------------------------------

Node = tuple[
    Any, ...
]  # ("leaf", kind, slot) | ("list"|"tuple", children) | ("dict", keys, children)


def shape_tree(schema: list[int], keys: list[Any]) -> Node | None:
    """The tree of a decoder's shape (leaf slots numbered in stream order), or None where a
    dict repeats a key (the unpickled dict keeps the last value: the reference reads it)."""
    stack: list[Any] = []
    slot = 0
    for t in schema:
        kind, c = t & ((1 << SHIFT) - 1), t >> SHIFT
        if kind <= NONE:
            stack.append(("leaf", kind, slot))
            slot += 1
        elif kind == LIST:
            stack.append(["list", []])
        elif kind == DICT:
            stack.append(["dict", [], []])
        elif kind == TUPLE:
            kids = stack[len(stack) - c :] if c else []
            del stack[len(stack) - c :]
            stack.append(["tuple", kids])
        elif kind == APPENDS:
            kids = stack[len(stack) - c :]
            del stack[len(stack) - c :]
            stack[-1][1].extend(kids)
        else:
            pairs = stack[len(stack) - 2 * c :]
            del stack[len(stack) - 2 * c :]
            for k, v in zip(pairs[::2], pairs[1::2], strict=True):
                stack[-1][1].append(keys[k[2]])
                stack[-1][2].append(v)
    top = stack[0]
    return _freeze(top)


def _freeze(node: Any) -> Node | None:
    if node[0] == "leaf":
        return tuple(node)
    kids = [_freeze(k) for k in node[-1]]
    if any(k is None for k in kids):
        return None
    if node[0] == "dict":
        if len(set(node[1])) != len(node[1]):
            return None
        return ("dict", tuple(node[1]), tuple(kids))
    return (node[0], tuple(kids))


_TREES_MAX = 64  # shapes kept per file
# a shape deeper than this has no tree (built, read and collated by recursion): the present
# path reads such samples, and names one deeper than the reader's max_depth
_TREE_DEPTH_MAX = 64


class NotCollatable(Exception):
    """``default_collate`` raises for these values (a None): collate them, to raise it."""


class ObjectColumn:
    """A field of a batch held by a decoder's table (see the module)."""

    __slots__ = ("_tree", "_trees", "_values", "decoder")

    def __init__(self, decoder: Any, trees: dict[Any, Node | None] | None = None) -> None:
        self.decoder = decoder
        self._trees = trees  # shapes seen before (a file's: its batches mostly share one)
        self._tree: Node | bool | None = False  # False: not built yet
        self._values: list[Any] | None = None

    @property
    def usable(self) -> bool:
        """Whether the decoded rows' values can be had (built per row where the batch is
        ragged, else made from the table by its shape)."""
        return bool(self.decoder.ragged) or self.tree is not None

    @property
    def tree(self) -> Node | None:
        """The batch's shape (None: not decoded, ragged, or not usable)."""
        if self._tree is False:
            d, trees = self.decoder, self._trees
            if d.schema is None or d.ragged or d.height >= _TREE_DEPTH_MAX:
                self._tree = None
            elif trees is None:
                self._tree = shape_tree(list(d.schema), list(d.keys))
            else:
                key = (tuple(d.schema), tuple(d.keys))
                got = trees.get(key, False)
                if got is False:
                    got = shape_tree(list(d.schema), list(d.keys))
                    if len(trees) >= _TREES_MAX:
                        trees.clear()
                    trees[key] = got
                self._tree = got
        return self._tree  # type: ignore[return-value]

    def __len__(self) -> int:
        return int(self.decoder.size)

    def values(self) -> list[Any]:
        """Every row's value, as unpickling its span gives it (a row not decoded: None)."""
        if self._values is None:
            d, tree = self.decoder, self.tree
            if d.ragged:  # each row's value built by the decoder (None: not decoded)
                self._values = d.rows
            elif tree is None:
                self._values = [None] * d.size
            else:
                got = _values(tree, d)
                if not d.filled.all():
                    got = [v if f else None for v, f in zip(got, d.filled.tolist(), strict=True)]
                self._values = got
        return self._values

    def value(self, k: int) -> Any:
        return self.values()[k]

    def collated(self, torch: Any) -> Any:
        """What ``default_collate`` gives for this field of the batch (its values in a
        tuple); :class:`NotCollatable` where it raises, or may (a ragged batch: its values go
        to ``default_collate``, which names what differs)."""
        tree = self.tree
        if tree is None or not self.decoder.filled.all():
            raise NotCollatable
        return _collate(torch, tree, self.decoder, tuple)


def _int_run(kids: tuple[Node, ...]) -> tuple[int, int] | None:
    """Slots ``a:b`` when ``kids`` are int leaves in consecutive slots."""
    if not kids or any(k[0] != "leaf" or k[1] != INT_ for k in kids):
        return None
    a = kids[0][2]
    if any(k[2] != a + j for j, k in enumerate(kids)):
        return None
    return a, a + len(kids)


def _values(node: Node, d: Any) -> list[Any]:
    size = d.size
    if node[0] == "leaf":
        kind, slot = node[1], node[2]
        if kind == INT_:
            return d.vals[slot].tolist()  # type: ignore[no-any-return]
        if kind == FLOAT:
            return d.vals[slot].view(np.float64).tolist()  # type: ignore[no-any-return]
        if kind == BOOL:
            return d.vals[slot].astype(bool).tolist()  # type: ignore[no-any-return]
        return list(d.objs[slot])
    if node[0] == "dict":
        keys, kids = node[1], node[2]
        if not kids:
            return [{} for _ in range(size)]
        return [
            dict(zip(keys, t, strict=True))
            for t in zip(*[_values(k, d) for k in kids], strict=True)
        ]
    kids = node[1]
    run = _int_run(kids)
    if node[0] == "list":
        if run is not None:
            return d.vals[run[0] : run[1]].T.tolist()  # type: ignore[no-any-return]
        if not kids:
            return [[] for _ in range(size)]
        return [list(t) for t in zip(*[_values(k, d) for k in kids], strict=True)]
    if not kids:
        return [() for _ in range(size)]
    return list(zip(*[_values(k, d) for k in kids], strict=True))


def _collate(torch: Any, node: Node, d: Any, seq: type) -> Any:
    """``default_collate`` of this node's values held in a ``seq`` (a dict's values come in a
    list, a sequence's transposed items in tuples)."""
    if node[0] == "leaf":
        kind, slot = node[1], node[2]
        if kind == INT_:
            return torch.from_numpy(d.vals[slot])
        if kind == FLOAT:
            return torch.from_numpy(d.vals[slot].view(np.float64))
        if kind == BOOL:
            return torch.from_numpy(d.vals[slot].astype(np.bool_))
        if kind == NONE:
            raise NotCollatable
        return seq(d.objs[slot])
    if node[0] == "dict":
        return {k: _collate(torch, v, d, list) for k, v in zip(node[1], node[2], strict=True)}
    run = _int_run(node[1])
    if run is not None:
        return list(torch.from_numpy(d.vals[run[0] : run[1]]).unbind(0))
    return [_collate(torch, k, d, tuple) for k in node[1]]


# -- one file's part of a batch ------------------------------------------------------------------


class ObjectFill:
    """How one span-read file's samples are decoded into a batch's columns: its fields read by
    span decoded by the compiled :class:`ObjectDecoder` (one per field and batch, kept by the
    field's column), its int fields from their decoded values; :attr:`usable` only where every
    field is one of these, the file is local and the compiled core built."""

    def __init__(self, reader: SpanReader, here: Opened, plan: ReadPlan) -> None:
        # weakly: kept by the reader's FileFill (see there)
        self.reader, self.fd, self.loader = weakref.proxy(reader), here.fd, here.loader
        scan = reader.scan
        self.nfields = len(plan.hows)
        self.fields = [f for f, how in enumerate(plan.hows) if how == SPAN]
        self.ints: list[tuple[int, np.ndarray]] = []
        usable = CORE is not None and here.fd >= 0 and here.loader is not None and self.fields
        for f, how in enumerate(plan.hows):
            field = plan.readers[f]
            if how == INT and isinstance(field, IntColumn) and field.values is not None:
                self.ints.append((f, np.asarray(field.values, np.int64)))
            elif how != SPAN:
                usable = False
        shift = reader.spans.shifts.single
        self.usable = bool(usable) and shift is not None and not reader.spans.general
        self.shift = shift or 0
        self.externals: dict[int, Any] = {}  # external memo key -> value (this file's)
        self.trees: dict[Any, Node | None] = {}  # the shapes of its batches (ObjectColumn.tree)
        self.last: dict[int, Any] = {}  # per span field, its last decoder (its shape: the next's)
        # the file mapped whole: a span is a guarded copy out of it, not a system call
        self.mapped = map_readonly(here.fd, reader.identity.size) if self.usable else None
        self.spans: list[Any] = []  # per span field, its compiled ObjectSpans
        loader = here.loader if reader.verify else None
        for f in self.fields if self.usable else ():
            starts, ends, bases = scan.starts[:, f], scan.ends[:, f], scan.memo_base[:, f]
            self.spans.append(
                require().ObjectSpans(
                    here.fd, loader, starts, ends, bases, self.shift, self.externals, self.mapped
                )
            )
        self.bounds = reader.bounds

    def new_column(self, size: int, k: int) -> ObjectColumn:
        """A decoded column of ``size`` rows for span field ``k``, its shapes cached with this
        file's (and the field's last tokens and keys reused when its batch has the same)."""
        col = ObjectColumn(require().ObjectDecoder(size, self.last.get(k)), self.trees)
        self.last[k] = col.decoder
        return col

    def close(self) -> None:
        """Let go of the file's mapping (its reader is closing the file); returns None."""
        self.spans, self.last = [], {}
        self.usable = False
        if self.mapped is not None:
            with contextlib.suppress(BufferError):  # a decode elsewhere may still hold it
                self.mapped.close()
            self.mapped = None

    def resolve(self, key: int) -> bool:
        """Put external memo ``key``'s value in :attr:`externals`; False: it cannot be read
        here (the reference reads the sample and names the error)."""
        spans = self.reader.spans
        try:
            self.externals[key] = spans._external(key, spans._memos())
        except (PickleshardError, UnresolvableMemoId, LookupError):
            return False
        return True


Part = tuple[Any, int, int]  # a file's FileFill (its .objects: an ObjectFill) and its run a:b


def decode_objects(
    parts: list[Part],
    items: np.ndarray,
    labels: np.ndarray,
    rows: np.ndarray,
    columns: list[Any],
) -> list[Part]:
    """Decode the batch's samples of the files ``parts`` (each ``(fill, a, b)``: its samples
    ``items[a:b]``, offset order, into rows ``rows[a:b]``; errors naming ``labels[a:b]``)
    into ``columns``, every file by one compiled call per object field; the parts it leaves
    (the caller reads them the present way): files with no :class:`ObjectFill`, and those
    from the first sample outside the grammar or the batch's shape on (all of them where a
    sample passes the bounds: the reference names it)."""
    fills = [p for p in parts if p[0].objects is not None and p[0].objects.usable]
    if not fills:
        return parts
    first: ObjectFill = fills[0][0].objects
    fields, ints = first.fields, [f for f, _ in first.ints]
    if any(
        p[0].objects.fields != fields or [f for f, _ in p[0].objects.ints] != ints for p in fills
    ):
        return parts  # files that disagree on their fields: each read the present way
    cols = [columns[f] for f in fields]
    if not all(c.decodable for c in cols):
        return parts
    objs: list[ObjectFill] = [p[0].objects for p in fills]
    if len(fills) == len(parts) and all(
        p[1] == q[2] for p, q in zip(parts[1:], parts, strict=False)
    ):
        lo, hi = parts[0][1], parts[-1][2]
        at: Any = slice(lo, hi)
        cuts = np.asarray([p[1] - lo for p in fills] + [hi - lo], np.int64)
    else:
        at = np.concatenate([np.arange(a, b) for _, a, b in fills])
        cuts = np.cumsum([0] + [b - a for _, a, b in fills]).astype(np.int64)
    its, rws, lbs = items[at], rows[at], labels[at]
    nbytes = np.zeros(len(fills), np.int64)
    good = len(fills)  # the files decoded whole, in every field
    largest, height = 8 * first.nfields + 8 * len(ints), 0
    last = len(cols) - 1
    for k, col in enumerate(cols):
        dec = col.decoding(functools.partial(first.new_column, k=k)).decoder
        srcs = [o.spans[k] for o in objs]
        j = 0
        while True:
            # each file's identity checked once a batch, after its last field's reads: a file
            # the last field leaves (declined) goes to the reference, which checks it
            answer, j, key, g, big = dec.decode(srcs, cuts, its, rws, lbs, j, nbytes, k == last)
            if answer != OD_EXTERNAL or not objs[g].resolve(key):
                break
        if not col.data.usable:
            good = 0  # a shape no value can be made of: every part the present way
        elif answer != OD_OK:
            good = min(good, g)
        largest += big
        height = max(height, dec.height)
    for o, n in zip(objs, nbytes.tolist(), strict=True):
        o.reader.stats.bytes_read += n
    bounds = first.bounds
    if bounds is not None and good:
        max_bytes, max_depth = bounds
        if (max_bytes is not None and largest > max_bytes) or (
            max_depth is not None and height and height + 1 > max_depth
        ):
            good = 0  # the reference reads them and names the sample
    if good and ints:  # each int field of the decoded files by one put
        edges = cuts[: good + 1].tolist()
        for n, f in enumerate(ints):
            got = [o.ints[n][1][its[c:e]] for o, c, e in zip(objs, edges, edges[1:], strict=False)]
            columns[f].put_rows(rws[: edges[-1]], np.concatenate(got) if len(got) > 1 else got[0])
    for o, (_, a, b) in zip(objs[:good], fills[:good], strict=True):
        o.reader.stats.fast_reads += (b - a) * len(fields)
    if good == len(fills) == len(parts):
        return []
    done = {id(p) for p in fills[:good]}
    return [p for p in parts if id(p) not in done]
