"""The oracle the format tests compare against: ``pickle.load`` of each whole file, and exact
equality (types, dtypes, shapes, bits).

Also the small builders the kit uses to write source datasets; :class:`SlowInt`, whose
unpickling sleeps; and :class:`GatedInt`, whose unpickling waits for a file to exist: it holds a
conversion in the middle until the test has killed it.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FieldLengthMismatchError, UnsupportedLayoutError

__all__ = [
    "GATED_GLOBAL",
    "SLOW_GLOBAL",
    "GatedInt",
    "SlowInt",
    "assert_same",
    "gated_int",
    "oracle_samples",
    "reference_samples",
    "slow_int",
    "write_files",
]

SLOW_GLOBAL = "pickleshard.testing.oracle.slow_int"


def slow_int(value: int, seconds: float) -> int:
    """Sleep ``seconds``, then return ``value`` (called by the unpickler for a :class:`SlowInt`)."""
    time.sleep(seconds)
    return value


GATED_GLOBAL = "pickleshard.testing.oracle.gated_int"
GATE_SECONDS = 600.0  # a gate left shut (its test died) fails the unpickling instead of hanging


def gated_int(value: int, gate: str) -> int:
    """Wait until the file ``gate`` exists, then return ``value`` (called by the unpickler for a
    :class:`GatedInt`)."""
    deadline = time.monotonic() + GATE_SECONDS
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate {gate} stayed shut for {GATE_SECONDS:.0f} s")
        time.sleep(0.01)
    return value


class GatedInt:
    """Pickles as ``gated_int(value, gate)``: it unpickles to the plain int once the file
    ``gate`` exists. A test holds a process at a known point this way (no sleep to outrun).

    Loading it needs ``allow_globals=[GATED_GLOBAL]`` (or ``trusted=True``).
    """

    def __init__(self, value: int, gate: str | os.PathLike[str]) -> None:
        self.value = value
        self.gate = os.fspath(gate)

    def __reduce__(self) -> tuple[Any, ...]:
        return (gated_int, (self.value, self.gate))


class SlowInt:
    """Pickles as ``slow_int(value, seconds)``: it unpickles to the plain int, slowly.

    Loading it needs ``allow_globals=[SLOW_GLOBAL]`` (or ``trusted=True``).
    """

    def __init__(self, value: int, seconds: float) -> None:
        self.value = value
        self.seconds = seconds

    def __reduce__(self) -> tuple[Any, ...]:
        return (slow_int, (self.value, self.seconds))


def write_files(folder: Path, objects: Sequence[Any], protocol: int = 5) -> list[Path]:
    """Pickle each object of ``objects`` to ``folder/part-<k>.pkl``; return the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, obj in enumerate(objects):
        path = folder / f"part-{k:03d}.pkl"
        with open(path, "wb") as fh:
            pickle.dump(obj, fh, protocol=protocol)
        paths.append(path)
    return paths


# The documented layout rules (docs/layouts.md, "What auto infers"), written here from the
# documentation alone: the oracle must not share the code it checks (scan.layouts, scan.records).
_MAX_LIST_COLUMNS = 64  # "a short list (at most 64 items) of sequences" is columns
_MAX_METADATA_TEXT = 4096  # "str/bytes up to 4 KiB" beside a one-pickle dict's columns


def _is_sequence(value: Any) -> bool:
    """A column: a list, a tuple or a numpy array of shape ``(N, ...)``."""
    return isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim >= 1)


def _is_metadata(value: Any) -> bool:
    """A small scalar kept as file metadata beside a one-pickle dict's columns."""
    if type(value) in (str, bytes):
        return len(value) <= _MAX_METADATA_TEXT
    return type(value) in (bool, int, float, type(None))


def _field_names(keys: Sequence[Any], path: str) -> tuple[str, ...]:
    """Dict keys as field names: ``bytes`` by their text, anything else by ``str()``."""
    names = tuple(
        k.decode("utf-8", "backslashreplace") if isinstance(k, bytes) else str(k) for k in keys
    )
    if len(set(names)) < len(names):
        raise UnsupportedLayoutError(path, f"dict keys {list(keys)} name one field twice")
    return names


def _positional_names(n: int) -> tuple[str, ...]:
    return tuple(("x", "y")[i] if i < 2 else f"f{i}" for i in range(n))


def _columns(
    fields: tuple[str, ...], columns: Sequence[Any], path: str
) -> tuple[tuple[str, ...], list[Any]]:
    lengths = {len(c) for c in columns}
    if len(lengths) > 1:
        raise FieldLengthMismatchError(path, f"columns of lengths {sorted(lengths)}")
    n = lengths.pop()
    return fields, [tuple(c[i] for c in columns) for i in range(n)]


def _split_one(obj: Any, path: str, metadata: bool) -> tuple[tuple[str, ...], list[Any]]:
    """Fields and samples of one pickle read as a layout: columns of a tuple, a dict (its small
    scalars are metadata when ``metadata``) or a short list; rows of a list of same-length
    tuples or of dicts. :class:`UnsupportedLayoutError` for anything else."""
    if isinstance(obj, dict) and obj:
        keys = [k for k, v in obj.items() if _is_sequence(v)]
        if not keys or any(
            not _is_sequence(v) and not (metadata and _is_metadata(v)) for v in obj.values()
        ):
            raise UnsupportedLayoutError(path, "a dict whose values are not all columns")
        return _columns(_field_names(keys, path), [obj[k] for k in keys], path)
    if isinstance(obj, tuple) and obj and all(_is_sequence(c) for c in obj):
        return _columns(_positional_names(len(obj)), obj, path)
    if isinstance(obj, list) and obj:
        first = obj[0]
        if (
            isinstance(first, tuple)
            and first
            and all(isinstance(r, tuple) and len(r) == len(first) for r in obj)
        ):
            return _positional_names(len(first)), [tuple(r) for r in obj]
        if isinstance(first, dict):
            if not all(isinstance(r, dict) for r in obj):
                raise UnsupportedLayoutError(path, "a list of dicts and other rows")
            keys = list(first)
            if any(k not in r for r in obj for k in keys):
                raise UnsupportedLayoutError(path, "rows of dicts with different keys")
            return _field_names(keys, path), [tuple(r[k] for k in keys) for r in obj]
        if len(obj) <= _MAX_LIST_COLUMNS and all(_is_sequence(c) for c in obj):
            return _columns(_positional_names(len(obj)), obj, path)
    raise UnsupportedLayoutError(path, f"a top-level {type(obj).__name__} that is no layout")


def _is_one_sample(obj: Any) -> bool:
    """docs/layouts.md: a file's one pickle, a dict or tuple, is one sample when it mixes
    sequences with other values (unless a dict's sequences are two or more columns of one
    length: those others are then metadata), holds arrays of different first dimensions, or
    two or more arrays, all of two dimensions or more and of one first dimension of 1 to 64."""
    if type(obj) not in (dict, tuple):
        return False
    values = list(obj.values()) if type(obj) is dict else list(obj)
    seqs = [v for v in values if _is_sequence(v)]
    if not seqs:
        return False
    lengths = {len(v) for v in seqs}
    if len(seqs) < len(values):
        return not (type(obj) is dict and len(seqs) >= 2 and len(lengths) == 1)
    if not all(isinstance(v, np.ndarray) for v in values):
        return False
    return len(lengths) > 1 or (
        len(values) >= 2
        and all(v.ndim >= 2 for v in values)
        and 1 <= min(lengths) <= _MAX_LIST_COLUMNS
    )


def _are_records(objs: Sequence[Any]) -> bool:
    """docs/layouts.md: appended pickles that are all dicts or tuples of numpy arrays of one
    first dimension of 1 to 64, the same in every pickle, with no 1-D array beside deeper ones
    (a label column), are one sample each."""
    values = [list(o.values()) if type(o) is dict else list(o) for o in objs]
    if not all(type(o) in (dict, tuple) for o in objs) or not all(values):
        return False
    if not all(isinstance(v, np.ndarray) and v.ndim >= 1 for vs in values for v in vs):
        return False
    rows = {len(v) for vs in values for v in vs}
    ndims = {v.ndim for v in values[0]}
    return len(rows) == 1 and 1 <= min(rows) <= 64 and not (1 in ndims and max(ndims) >= 2)


def _one_sample_each(objs: Sequence[Any], path: str) -> tuple[tuple[str, ...], list[Any]]:
    """Appended pickles that are not all layouts: one sample per pickle."""
    first = objs[0]
    if type(first) is tuple and first:
        if any(type(o) is not tuple or len(o) != len(first) for o in objs):
            raise UnsupportedLayoutError(path, "appended samples of different shapes")
        return _positional_names(len(first)), [tuple(o) for o in objs]
    if type(first) is dict and first:
        keys = list(first)
        if any(type(o) is not dict or any(k not in o for k in keys) for o in objs):
            raise UnsupportedLayoutError(path, "appended dict samples with different keys")
        return _field_names(keys, path), [tuple(o[k] for k in keys) for o in objs]
    return ("x",), [(o,) for o in objs]


def reference_samples(objs: Sequence[Any], path: str) -> tuple[tuple[str, ...], list[Any]]:
    """Fields and samples of a file whose ``pickle.load`` calls returned ``objs``, by the
    documented ``layout="auto"`` rules (docs/layouts.md), written independently of
    :mod:`pickleshard.scan`, which it checks: one pickle is a layout (its dict's small scalars are
    file metadata) or one sample (:func:`_is_one_sample`); several are chunks, samples in
    file order, when every one is a layout with the same fields and they are not records
    (:func:`_are_records`), and otherwise one sample each (an exact tuple gives one field per item, an
    exact dict one per key of the first, anything else the single field ``x``)."""
    if len(objs) == 1:
        if _is_one_sample(objs[0]):
            return _one_sample_each(objs, path)
        return _split_one(objs[0], path, metadata=True)
    try:
        chunks = [_split_one(o, path, metadata=False) for o in objs]
    except UnsupportedLayoutError:
        return _one_sample_each(objs, path)
    if _are_records(objs):
        return _one_sample_each(objs, path)
    fields = chunks[0][0]
    if any(f != fields for f, _ in chunks):
        raise UnsupportedLayoutError(path, "appended chunks with different fields")
    return fields, [s for _, samples in chunks for s in samples]


def oracle_samples(paths: Sequence[str | os.PathLike[str]]) -> list[Any]:
    """Every sample of ``paths`` in order, from ``pickle.load`` alone (columns/dict layouts),
    in the producer's type: a dict of columns gives dicts keyed by field, else tuples."""
    out: list[Any] = []
    for path in paths:
        with open(path, "rb") as fh:
            obj = pickle.load(fh)  # the oracle: files the tests wrote themselves
        if isinstance(obj, dict):
            names = _field_names(list(obj), os.fspath(path))
            columns = list(obj.values())
            n = len(columns[0])
            out += [dict(zip(names, (c[i] for c in columns), strict=True)) for i in range(n)]
            continue
        columns = list(obj)
        out += [tuple(c[i] for c in columns) for i in range(len(columns[0]))]
    return out


def _float_bits(x: float) -> bytes:
    return struct.pack("<d", x)


def assert_same(got: Any, want: Any, where: str = "sample") -> None:
    """Assert ``got`` equals ``want`` exactly: same types, dtypes, shapes and bytes, recursively."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
        if want.dtype.hasobject:
            for k, (g, w) in enumerate(zip(got.reshape(-1), want.reshape(-1), strict=True)):
                assert_same(g, w, f"{where}[{k}]")
        else:
            assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), (
                f"{where}: array values differ"
            )
    elif isinstance(want, np.generic):
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), (
            f"{where}: {got!r} != {want!r}"
        )
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{k}]")
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, float):
        assert _float_bits(got) == _float_bits(want), f"{where}: {got!r} != {want!r}"
    elif "torch" in sys.modules and isinstance(want, sys.modules["torch"].Tensor):
        torch = sys.modules["torch"]
        assert got.dtype == want.dtype, f"{where}: tensor dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{where}: tensor shape {got.shape} != {want.shape}"
        assert torch.equal(got, want), f"{where}: tensor values differ"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def same(got: Any, want: Any) -> bool:
    """Whether :func:`assert_same` holds: for a test that sorts a value (which of two versions
    of a file a read saw, say) rather than asserting one."""
    try:
        assert_same(got, want)
    except AssertionError:
        return False
    return True
