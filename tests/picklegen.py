"""Hypothesis strategies and helpers for the scanner and span-reader tests.

``datasets()`` draws a whole file's content: a layout, its columns (nested containers, strings,
bytes, ints of every size, floats, numpy arrays of many dtypes and memory orders, torch tensors,
objects shared within and across samples), and how to pickle it. ``build`` turns columns into the
top-level object of a layout, ``write`` pickles it, ``oracle`` reads the samples back through
``pickle.load`` alone, and ``assert_same`` compares values, types and object identity.
"""

from __future__ import annotations

import contextlib
import io
import math
import pickle
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from pickleshard.testing.oracle import reference_samples

LAYOUTS = (
    "columns",
    "columns_list",
    "dict_columns",
    "rows",
    "dict_rows",
    "appended_samples",
    "appended_columns",
)

_DTYPES = [
    np.dtype(d)
    for d in (
        "bool",
        "i1",
        "u2",
        "<i4",
        ">i4",
        "i8",
        "f2",
        "f4",
        ">f8",
        "c8",
        "U3",
        "S2",
        "M8[s]",
        "m8[ms]",
    )
] + [np.dtype([("a", "<i4"), ("b", "<f8", (2,))])]


@st.composite
def ndarrays(draw: st.DrawFn, max_side: int = 4) -> np.ndarray:
    """Arrays of many dtypes: 0-d, empty, C or Fortran order, or non-contiguous sources."""
    dtype = draw(st.sampled_from(_DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, max_side), max_size=3)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    raw = rng.integers(0, 255, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    arr = (
        raw.view(dtype).reshape(shape)
        if dtype.kind not in "fc"
        else rng.standard_normal(shape).astype(dtype)
    )
    if dtype.kind in "UM" or dtype.names:
        arr = np.zeros(shape, dtype)  # random bytes are not valid code points or dates
    how = draw(st.sampled_from(["c", "fortran", "strided", "transposed"]))
    if how == "fortran":
        arr = np.asfortranarray(arr)
    elif how == "strided" and arr.ndim:
        arr = np.repeat(arr, 2, axis=0)[::2]
    elif how == "transposed":
        arr = arr.T
    return arr


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    dtype = draw(st.sampled_from([torch.float32, torch.int64, torch.uint8]))
    return (
        (torch.arange(int(np.prod(shape)) or 1)[: int(np.prod(shape))] % 7).reshape(shape).to(dtype)
    )


_INTS = st.one_of(
    st.integers(-300, 300),
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**31, -(2**31) - 1, 2**64, 7**200]),
)
_FLOATS = st.floats(allow_nan=False)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    _INTS,
    _FLOATS,
    st.text(max_size=8),
    st.sampled_from(["x", "label", "é", "\U0001f600"]),
    st.binary(max_size=8),
    st.binary(max_size=8).map(bytearray),
)


def values(pool: list[Any] | None = None, arrays: bool = True) -> st.SearchStrategy[Any]:
    """Nested values; items are sometimes drawn from ``pool`` (shared objects)."""
    base: st.SearchStrategy[Any] = leaves
    if arrays:
        base = st.one_of(base, ndarrays(), tensors())
    if pool:
        base = st.one_of(base, st.sampled_from(pool))
    return st.recursive(
        base,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.lists(inner, max_size=3).map(tuple),
            st.dictionaries(st.text(max_size=3), inner, max_size=3),
            st.frozensets(st.integers(0, 9), max_size=3),
        ),
        max_leaves=6,
    )


@st.composite
def datasets(draw: st.DrawFn) -> dict[str, Any]:
    """A file's content: ``layout``, ``columns`` (one list per field), ``protocol``, ``names``."""
    pool = draw(st.lists(st.one_of(values(arrays=True), st.just([1, 2])), max_size=3))
    layout = draw(st.sampled_from(LAYOUTS))
    n = draw(st.integers(1, 12))
    nf = draw(st.integers(1, 3))
    columns = [draw(st.lists(values(pool), min_size=n, max_size=n)) for _ in range(nf)]
    if draw(st.booleans()):  # the same object inside one sample, in two fields or twice in one
        shared = draw(values(pool))
        i = draw(st.integers(0, n - 1))
        columns[0][i] = [shared, shared]
        if nf > 1:
            columns[-1][i] = shared
    if layout in ("columns", "dict_columns") and draw(st.booleans()):
        columns.append(_stacked(draw, n))
    big = draw(st.sampled_from([0, 0, 0, 70_000, 200_000]))  # files and payloads over 64 KiB
    if big:
        columns[0][draw(st.integers(0, n - 1))] = draw(
            st.sampled_from([b"\x01" * big, bytearray(big), np.ones(big // 8)])
        )
    names = draw(
        st.lists(
            st.text(min_size=1, max_size=4),
            min_size=len(columns),
            max_size=len(columns),
            unique=True,
        )
    )
    protocol = draw(st.sampled_from([2, 3, 4, 5]))
    numpy1 = draw(st.booleans())
    return {
        "layout": layout,
        "columns": columns,
        "names": names,
        "protocol": protocol,
        "numpy1": numpy1,
    }


def _stacked(draw: st.DrawFn, n: int) -> np.ndarray:
    """One numpy array of shape (n, ...) used as a whole field."""
    dtype = draw(st.sampled_from([d for d in _DTYPES if d.kind not in "UM" and not d.names]))
    inner = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    arr = np.arange(n * int(np.prod(inner)), dtype=np.int64).reshape((n, *inner)).astype(dtype)
    return arr


def build(layout: str, columns: list[Any], names: list[str]) -> list[Any]:
    """The objects to pickle (one per ``pickle.dump`` call) for ``layout``."""
    n = len(columns[0])
    if layout == "columns":
        return [tuple(columns)]
    if layout == "columns_list":
        return [list(columns)]
    if layout == "dict_columns":
        return [dict(zip(names, columns, strict=True))]
    if layout == "rows":
        return [[tuple(c[i] for c in columns) for i in range(n)]]
    if layout == "dict_rows":
        return [[dict(zip(names, (c[i] for c in columns), strict=True)) for i in range(n)]]
    if layout == "appended_samples":
        return [tuple(c[i] for c in columns) for i in range(n)]
    half = max(1, n // 2)  # appended_columns: two chunks of (x_list, y_list...)
    return (
        [tuple(c[:half] for c in columns), tuple(c[half:] for c in columns)]
        if n > half
        else [tuple(columns)]
    )


def write(path: Path, objs: list[Any], protocol: int, *, numpy1: bool = False) -> Path:
    with open(path, "wb") as fh:
        for obj in objs:
            fh.write(dumps(obj, protocol, numpy1=numpy1))
    return path


def oracle(path: Path) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """Field names and samples of ``path`` from ``pickle.load`` alone, by the rules of
    :mod:`pickleshard.scan`: one pickle is a layout (:func:`decode_layout`); several are chunks
    when every one is a layout, else one sample each (an exact tuple gives one field per item, an
    exact dict one per key of the first, anything else the single field ``x``)."""
    objs = []
    with open(path, "rb") as fh:
        size = Path(path).stat().st_size
        while fh.tell() < size:
            objs.append(pickle.load(fh))
    return reference_samples(objs, str(path))


def assert_same(got: Any, want: Any, _ids: dict[int, int] | None = None, _path: str = "") -> None:
    """Equal values and types, and the same sharing: two places hold one object in ``got``
    exactly when they do in ``want`` (checked for mutable objects)."""
    ids = {} if _ids is None else _ids
    assert type(got) is type(want), f"{_path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, (list, dict, bytearray, np.ndarray, torch.Tensor, set)):
        seen = ids.setdefault(id(want), id(got))
        assert seen == id(got), f"{_path}: sharing differs from pickle.load"
    if isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), _path
        assert got.tobytes() == want.tobytes(), _path
        assert got.flags.writeable == want.flags.writeable, f"{_path}: writeable flag differs"
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype, _path
        assert torch.equal(got, want), _path
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), _path
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, ids, f"{_path}[{k}]")
    elif isinstance(want, dict):
        assert list(got) == list(want), _path
        for k in want:
            assert_same(got[k], want[k], ids, f"{_path}[{k!r}]")
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), _path
    elif isinstance(want, np.generic):
        assert got.tobytes() == want.tobytes(), _path
    else:
        assert got == want, f"{_path}: {got!r} != {want!r}"


def _alias(fn: Any, module: str, name: str) -> Any:
    def alias(*args: Any) -> Any:
        return fn(*args)

    alias.__module__, alias.__qualname__, alias.__name__ = module, name, name
    return alias


@contextlib.contextmanager
def _numpy1_names() -> Iterator[dict[Any, Any]]:
    """Make pickle write numpy's reconstruction functions under their numpy 1.x module names."""
    from numpy._core import multiarray, numeric

    saved = {m: sys.modules.get(m) for m in ("numpy.core.multiarray", "numpy.core.numeric")}
    aliases: dict[Any, Any] = {}
    for old, real, attr in (
        ("numpy.core.multiarray", multiarray, "_reconstruct"),
        ("numpy.core.numeric", numeric, "_frombuffer"),
    ):
        fn = getattr(real, attr)
        alias = _alias(fn, old, attr)
        module = types.ModuleType(old)
        setattr(module, attr, alias)
        sys.modules[old] = module
        aliases[fn] = alias
    try:
        yield aliases
    finally:
        for m, mod in saved.items():
            if mod is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = mod


def dumps(obj: Any, protocol: int, *, numpy1: bool = False) -> bytes:
    """``pickle.dumps``, or with numpy arrays under the numpy 1.x ``numpy.core`` module paths."""
    if not numpy1:
        return pickle.dumps(obj, protocol=protocol)
    buf = io.BytesIO()
    with _numpy1_names() as aliases:

        class Numpy1Pickler(pickle.Pickler):
            def reducer_override(self, o: Any) -> Any:
                if type(o) is np.ndarray:
                    rv = o.__reduce_ex__(protocol)
                    return (aliases.get(rv[0], rv[0]), *rv[1:])
                return NotImplemented

        Numpy1Pickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()
