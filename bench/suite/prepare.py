"""Each loader's one-time preparation of a dataset, with the loader's own tool, timed.

A preparation writes into ``DatasetSpec.prepared(key)`` and records ``prep.json`` there
(seconds, output bytes, the tool, the code version that made it: :func:`code_version`) when
complete, so a later run of the same code reuses it; a copy made by other code (or with no code
version recorded) is made again, and the returned record says so (``redone``). Loaders that read the
same prepared copy share it: ``span`` and ``whole`` the pickleshard index, ``memmap`` and
``memmap-plain`` one conversion, and so on. ``naive`` has no preparation: it loads everything
when the row starts (timed there).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import subprocess
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from .plan import DatasetSpec

__all__ = ["PREP_KEY", "code_version", "prepare", "prepared_info"]

#: loader -> the preparation it reads (None: nothing to prepare)
PREP_KEY: dict[str, str | None] = {
    "naive": None,
    "folk-seq": "folk",
    "folk-shuffled": "folk",
    "whole": "index",
    "span": "index",
    "span-collate": "index",
    "loader": "index",
    "memmap": "memmap",
    "memmap-plain": "memmap",
    "lmdb": "lmdb",
    "lmdb-plain": "lmdb",
    "webdataset": "webdataset",
    "webdataset-plain": "webdataset",
    "lance": "lance",
    "lance-plain": "lance",
    "arrayrecord": "arrayrecord",
    "grain": "arrayrecord",
    "litdata": "litdata",
    "mosaic": "mosaic",
    "hf": "hf",
}

MARKER = "prep.json"


REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout


def code_version() -> str:
    """The code a preparation is made with: pickleshard's installed version and the repository's
    ``git describe --always --dirty``; a dirty tree adds a hash of its changes (tracked diffs and
    untracked files' names), so two different sets of uncommitted edits differ."""
    try:
        version = metadata.version("pickleshard")
    except metadata.PackageNotFoundError:
        version = "not installed"
    commit = (_git("describe", "--always", "--dirty") or "no git").strip()
    if commit.endswith("-dirty"):
        changes = (_git("diff", "HEAD") or "") + (_git("status", "--porcelain") or "")
        commit += "." + hashlib.sha256(changes.encode()).hexdigest()[:12]
    return f"{version} ({commit})"


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


def _decoded_bytes(spec: DatasetSpec, out: Path) -> int:
    """The dataset's decoded size as the index records it (what the whole-file cache counts)."""
    from pickleshard import open_index

    index, _ = open_index(spec.directory, index=out / "index", rebuild="never")
    return sum(f.decoded_nbytes for f in index.files)


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


def import_streaming() -> tuple[Any, str]:
    """``streaming`` (mosaicml-streaming), and a note when torchvision had to be stood in for.

    ``streaming`` imports torchvision at import time, for its vision dataset classes only
    (``streaming.vision``); ``MDSWriter`` and ``StreamingDataset`` never use it. Where the
    installed torchvision cannot load against this torch (PyPI's torchvision wheel is a CUDA
    build, this machine's torch a CPU one: ``operator torchvision::nms does not exist``), a
    placeholder module that raises on use takes its place, and the row's tool says so.
    """
    import importlib.machinery
    import sys
    import types

    note = ""
    try:
        import torchvision  # type: ignore[import-not-found]  # noqa: F401
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]

        def unusable(*_: Any, **__: Any) -> Any:
            raise RuntimeError(f"torchvision is not usable here ({why})")

        tv = types.ModuleType("torchvision")
        parts = {
            "torchvision": tv,
            "torchvision.datasets": types.ModuleType("torchvision.datasets"),
            "torchvision.transforms": types.ModuleType("torchvision.transforms"),
            "torchvision.transforms.functional": types.ModuleType(
                "torchvision.transforms.functional"
            ),
        }
        parts["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})  # type: ignore[attr-defined]
        parts["torchvision.datasets"].CIFAR10 = unusable  # type: ignore[attr-defined]
        parts["torchvision.transforms.functional"].to_tensor = unusable  # type: ignore[attr-defined]
        for name, module in parts.items():
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(parts[parent], child, module)
        # in this process's sys.modules only: a DataLoader worker started by fork inherits it
        # (the suite's default), one started by spawn would import the real torchvision again
        sys.modules.update(parts)
        note = f"; torchvision stood in for (it does not load: {why})"
    try:
        import streaming
    except Exception as exc:
        raise ImportError(f"{type(exc).__name__}: {exc}", name="streaming") from exc
    return streaming, note


def _mosaic(spec: DatasetSpec, out: Path) -> str:
    import numpy as np

    streaming, note = import_streaming()

    x0, _ = next(_samples(spec))
    if isinstance(x0, np.ndarray):
        dims = ",".join(str(d) for d in x0.shape)
        columns = {"x": f"ndarray:{x0.dtype.name}:{dims}", "y": "int"}
    else:
        columns = {"x": "json", "y": "int"}
    with streaming.MDSWriter(out=str(out / "data"), columns=columns, size_limit="64mb") as w:
        for x, y in _samples(spec):
            w.write({"x": x, "y": y})
    return f"streaming.MDSWriter (mosaicml-streaming {streaming.__version__}, 64 MB shards){note}"


def _hf_features(spec: DatasetSpec) -> Any:
    """Fixed-shape arrays declared as HF ``ArrayND`` features (as HF's docs advise: inferred,
    they become nested lists that ``with_format("numpy")`` rebuilds element by element);
    objects inferred."""
    import datasets
    import numpy as np

    x0, _ = next(_samples(spec))
    if not isinstance(x0, np.ndarray) or not 2 <= x0.ndim <= 5:
        return None
    array = getattr(datasets, f"Array{x0.ndim}D")
    return datasets.Features(
        {"x": array(shape=x0.shape, dtype=x0.dtype.name), "y": datasets.Value("int64")}
    )


def _hf(spec: DatasetSpec, out: Path) -> str:
    import datasets

    def rows() -> Iterator[dict[str, Any]]:
        for x, y in _samples(spec):
            yield {"x": x, "y": y}

    features = _hf_features(spec)
    ds = datasets.Dataset.from_generator(rows, features=features, cache_dir=str(out / "cache"))
    ds.save_to_disk(str(out / "data"))
    shutil.rmtree(out / "cache", ignore_errors=True)
    how = "ArrayND features" if features is not None else "inferred features"
    return (
        f"datasets.Dataset.from_generator ({how}) + save_to_disk (datasets {datasets.__version__})"
    )


def prepare(spec: DatasetSpec, key: str) -> dict[str, Any]:
    """Build ``key``'s copy of ``spec`` (unless complete and made by this code) and return its
    record: ``reused`` when an earlier run's copy serves, ``redone`` saying why one was made
    again (neither is written to ``prep.json``)."""
    code = code_version()
    done = prepared_info(spec, key)
    if done is not None and done.get("code") == code:
        return {**done, "reused": True}
    redone = (
        None
        if done is None
        else f"made again: the earlier copy was made by {done.get('code', 'unrecorded code')}"
    )
    out = spec.prepared(key)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    if key == "folk":
        tool = _folk(spec, out)
    elif key == "index":
        tool = _index(spec, out)
    elif key in ("memmap", "lmdb", "webdataset", "lance", "arrayrecord"):
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
    record: dict[str, Any] = {
        "key": key,
        "seconds": seconds,
        "bytes": size,
        "tool": tool,
        "code": code,
    }
    if key == "index":
        record["decoded_bytes"] = _decoded_bytes(spec, out)
    (out / MARKER).write_text(json.dumps(record))
    return record if redone is None else {**record, "redone": redone}
