"""Each loader's one-time preparation of a dataset, with the loader's own tool, timed.

A preparation writes into ``DatasetSpec.prepared(key)`` and records ``prep.json`` there
(seconds, output bytes, the tool) when complete, so a later run reuses it. Loaders that read the
same prepared copy share it: ``span`` and ``whole`` the pickleshard index, ``memmap`` and
``memmap-plain`` one conversion, and so on. ``naive`` has no preparation: it loads everything
when the row starts (timed there).
"""

from __future__ import annotations

import json
import pickle
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .plan import DatasetSpec

__all__ = ["PREP_KEY", "prepare", "prepared_info"]

#: loader -> the preparation it reads (None: nothing to prepare)
PREP_KEY: dict[str, str | None] = {
    "naive": None,
    "folk-seq": "folk",
    "folk-shuffled": "folk",
    "whole": "index",
    "span": "index",
    "memmap": "memmap",
    "memmap-plain": "memmap",
    "lmdb": "lmdb",
    "lmdb-plain": "lmdb",
    "webdataset": "webdataset",
    "webdataset-plain": "webdataset",
    "litdata": "litdata",
    "mosaic": "mosaic",
    "hf": "hf",
}

MARKER = "prep.json"


def prepared_info(spec: DatasetSpec, key: str) -> dict[str, Any] | None:
    """The record of a complete preparation, or None."""
    marker = spec.prepared(key) / MARKER
    return json.loads(marker.read_text()) if marker.exists() else None


def _pickles(spec: DatasetSpec) -> list[Path]:
    return sorted(spec.directory.glob("*.pkl"))


def _samples(spec: DatasetSpec) -> Iterator[tuple[Any, int]]:
    """Every sample of the dataset in order, one file in memory at a time (what a converter does)."""
    for path in _pickles(spec):
        with open(path, "rb") as fh:
            xs, ys = pickle.load(fh)
        yield from zip(xs, ys, strict=True)


def _folk(spec: DatasetSpec, out: Path) -> str:
    from bench.baselines import write_folk_index

    write_folk_index(_pickles(spec), out / "folk.json")
    return "json (each file unpickled to count its samples)"


def _index(spec: DatasetSpec, out: Path) -> str:
    from pickleshard import build_index

    build_index(spec.directory, index=out / "index")
    return "pickleshard build_index (opcode scan)"


def _convert(spec: DatasetSpec, out: Path, to: str) -> str:
    from pickleshard import convert

    convert(spec.directory, out / "data", to=to, jobs=2)
    return f"pickleshard convert --to {to} --jobs 2"


def litdata_samples(path: str) -> Iterator[dict[str, Any]]:
    """LitData's ``fn``: one input file's samples (module level: its workers pickle it)."""
    with open(path, "rb") as fh:
        xs, ys = pickle.load(fh)
    for x, y in zip(xs, ys, strict=True):
        yield {"x": x, "y": y}


def _litdata(spec: DatasetSpec, out: Path) -> str:
    import litdata

    litdata.optimize(
        fn=litdata_samples,
        inputs=[str(p) for p in _pickles(spec)],
        output_dir=str(out / "data"),
        chunk_bytes="64MB",
        num_workers=2,
    )
    return f"litdata.optimize (litdata {litdata.__version__}, 2 workers, 64 MB chunks)"


def import_streaming() -> Any:
    """``streaming`` (mosaicml-streaming), which imports torchvision: a torchvision built for
    another torch fails with a RuntimeError, reported as the peer being unavailable."""
    try:
        import streaming
    except Exception as exc:
        raise ImportError(f"{type(exc).__name__}: {exc}", name="streaming") from exc
    return streaming


def _mosaic(spec: DatasetSpec, out: Path) -> str:
    import numpy as np

    streaming = import_streaming()

    x0, _ = next(_samples(spec))
    if isinstance(x0, np.ndarray):
        dims = ",".join(str(d) for d in x0.shape)
        columns = {"x": f"ndarray:{x0.dtype.name}:{dims}", "y": "int"}
    else:
        columns = {"x": "json", "y": "int"}
    with streaming.MDSWriter(out=str(out / "data"), columns=columns, size_limit="64mb") as w:
        for x, y in _samples(spec):
            w.write({"x": x, "y": y})
    return f"streaming.MDSWriter (mosaicml-streaming {streaming.__version__}, 64 MB shards)"


def _hf(spec: DatasetSpec, out: Path) -> str:
    import datasets

    def rows() -> Iterator[dict[str, Any]]:
        for x, y in _samples(spec):
            yield {"x": x, "y": y}

    ds = datasets.Dataset.from_generator(rows, cache_dir=str(out / "cache"))
    ds.save_to_disk(str(out / "data"))
    shutil.rmtree(out / "cache", ignore_errors=True)
    return f"datasets.Dataset.from_generator + save_to_disk (datasets {datasets.__version__})"


def prepare(spec: DatasetSpec, key: str) -> dict[str, Any]:
    """Build ``key``'s copy of ``spec`` (unless complete) and return its record."""
    done = prepared_info(spec, key)
    if done is not None:
        return done
    out = spec.prepared(key)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    if key == "folk":
        tool = _folk(spec, out)
    elif key == "index":
        tool = _index(spec, out)
    elif key in ("memmap", "lmdb", "webdataset"):
        tool = _convert(spec, out, key)
    elif key == "litdata":
        tool = _litdata(spec, out)
    elif key == "mosaic":
        tool = _mosaic(spec, out)
    elif key == "hf":
        tool = _hf(spec, out)
    else:
        raise ValueError(f"no preparation called {key!r}")
    seconds = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    record = {"key": key, "seconds": seconds, "bytes": size, "tool": tool}
    (out / MARKER).write_text(json.dumps(record))
    return record
