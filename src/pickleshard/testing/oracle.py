"""The oracle the format tests compare against: ``pickle.load`` of each whole file, and exact
equality (types, dtypes, shapes, bits).

Also the small builders the kit uses to write source datasets, and :class:`SlowInt`, whose
unpickling sleeps: it makes a conversion slow enough to be killed in the middle.
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

__all__ = [
    "SLOW_GLOBAL",
    "SlowInt",
    "assert_same",
    "oracle_samples",
    "slow_int",
    "write_files",
]

SLOW_GLOBAL = "pickleshard.testing.oracle.slow_int"


def slow_int(value: int, seconds: float) -> int:
    """Sleep ``seconds``, then return ``value`` (called by the unpickler for a :class:`SlowInt`)."""
    time.sleep(seconds)
    return value


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


def reference_samples(objs: Sequence[Any], path: str) -> tuple[tuple[str, ...], list[Any]]:
    """Fields and samples of a file whose ``pickle.load`` calls returned ``objs``, by the rules
    of :mod:`pickleshard.scan` for appended pickles: one pickle is a layout
    (:func:`~pickleshard.scan.layouts.decode_layout`); several are chunks when every one is a layout,
    else one sample each (an exact tuple gives one field per item, an exact dict one per key of
    the first, anything else the single field ``x``). Independent of
    :func:`~pickleshard.scan.records.decode_records`, which it checks."""
    from ..errors import UnsupportedLayoutError
    from ..scan.layouts import LAYOUT_TABLE, decode_layout, default_field_names

    try:
        decoded = [decode_layout(o, path) for o in objs]
    except UnsupportedLayoutError:
        if len(objs) == 1:
            raise
        first = objs[0]
        sample = (
            "tuple"
            if type(first) is tuple and first
            else "dict"
            if type(first) is dict and first
            else None
        )
        layout = next(
            (x for x in LAYOUT_TABLE.values() if x.per_pickle and x.sample == sample), None
        )
        if layout is None:  # any other object: the single field x
            return ("x",), [(o,) for o in objs]
        if layout.keyed:
            keys = list(first)
            return tuple(str(k) for k in keys), [tuple(o[k] for k in keys) for o in objs]
        return default_field_names(len(first)), [tuple(o) for o in objs]
    return decoded[0].fields, [s for d in decoded for s in zip(*d.columns, strict=True)]


def oracle_samples(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[Any, ...]]:
    """Every sample of ``paths`` in order, from ``pickle.load`` alone (columns/dict layouts)."""
    out: list[tuple[Any, ...]] = []
    for path in paths:
        with open(path, "rb") as fh:
            obj = pickle.load(fh)  # the oracle: files the tests wrote themselves
        columns = list(obj.values()) if isinstance(obj, dict) else list(obj)
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
