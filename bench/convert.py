"""``python -m bench.convert``: converting to memmap / LMDB / WebDataset, and reading them back.

Two tables, measured in one process on one synthetic dataset (``bench.data``: float32
``(3, 32, 32)`` arrays and int labels, ``pickle.dump((x_list, y_list))`` per file):

Parquet and Arrow rows come from :mod:`bench.convert_arrow`.

1. **Conversion**: seconds and seconds per GB of source pickles, for ``pickleshard.pipelines.convert.run`` to
   each format against the naive loop a user would write (load each pickle whole, then write
   with the plain library: ``np.lib.format.open_memmap``, ``lmdb`` with pickled values,
   ``webdataset.ShardWriter``). The source's index is built first and timed on its own row.
2. **Shuffled epoch**: samples/s over one epoch through ``DataLoader(batch_size=256,
   shuffle=True, num_workers=0)``: pickleshard's readers against raw ``np.memmap`` on the same
   ``.npy`` files (per sample, and batched with fancy indexing), a plain LMDB reader
   (``pickle.loads`` per key), and ``webdataset.WebDataset(...).shuffle(1000).decode()`` on
   the same shards. Target: the memmap reader at >= 0.9x the faster raw ``np.memmap`` row.
   Plain ``lmdb`` also reads pickleshard's own LMDB output with the documented decoding.
3. **Split**: the whole dataset as one pickle, cut into 64 MiB chunks by ``pickleshard split``
   and by the naive loop (``pickle.load`` whole, dump slices), each in a fresh process: seconds
   per GB and peak PSS against the file's size.

Writes ``bench/results/convert[-quick].md`` and ``.json``. ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import webdataset as wds  # type: ignore[import-untyped]
from torch.utils.data import DataLoader, Dataset

from pickleshard import build_index
from pickleshard.formats import open_dataset
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.verify.run import verify

from .baselines import RawMemmap
from .convert_arrow import NAMES as ARROW_NAMES
from .convert_arrow import arrow_conversions, arrow_reads
from .data import DataSpec, ensure_data
from .report import describe_machine, report_head, save_results

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
SIZES = {"quick": (4, 250), "small": (4, 2500), "full": (8, 5000)}
BATCH = 256
SHARD_BYTES = 64 << 20
FORMATS = ("memmap", "LMDB", "WebDataset", "Parquet", "Arrow")


@dataclass(frozen=True)
class Row:
    """One measurement: ``seconds`` for ``samples`` samples (``nbytes`` source or read bytes)."""

    table: str
    name: str
    seconds: float
    samples: int
    nbytes: int
    note: str = ""
    peak_pss: int = 0


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- the naive "load each pickle, write" loops -------------------------------------------------


def _load(path: Path) -> tuple[list[np.ndarray[Any, Any]], list[int]]:
    with open(path, "rb") as fh:
        xs, ys = pickle.load(fh)
    return xs, ys


def naive_memmap(paths: Sequence[Path], out: Path, n: int, shape: tuple[int, ...]) -> None:
    out.mkdir(parents=True)
    x = np.lib.format.open_memmap(out / "x.npy", mode="w+", dtype=np.float32, shape=(n, *shape))
    y = np.lib.format.open_memmap(out / "y.npy", mode="w+", dtype=np.int64, shape=(n,))
    i = 0
    for path in paths:
        xs, ys = _load(path)
        x[i : i + len(xs)] = np.stack(xs)
        y[i : i + len(ys)] = ys
        i += len(xs)
    x.flush()
    y.flush()


def naive_lmdb(paths: Sequence[Path], out: Path) -> None:
    env = lmdb.open(str(out), map_size=1 << 36, lock=False, sync=False)
    i = 0
    for path in paths:
        xs, ys = _load(path)
        with env.begin(write=True) as txn:
            for x, y in zip(xs, ys, strict=True):
                txn.put(i.to_bytes(8, "big"), pickle.dumps((x, y), protocol=5), append=True)
                i += 1
    env.sync(True)
    env.close()


def naive_webdataset(paths: Sequence[Path], out: Path) -> None:
    out.mkdir(parents=True)
    i = 0
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
        for path in paths:
            xs, ys = _load(path)
            for x, y in zip(xs, ys, strict=True):
                sink.write({"__key__": f"{i:010d}", "x.npy": x, "y.cls": y})
                i += 1


# ---- plain readers ----------------------------------------------------------------------------


class RawMemmapBatched(RawMemmap):
    """The same, plus ``__getitems__`` by fancy indexing, as a careful user would write it."""

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, int]]:
        idx = np.asarray(indices)
        return list(zip(self.x[idx], self.y[idx].tolist(), strict=True))


class PlainLmdb(Dataset[Any]):
    """The usual LMDB dataset: ``pickle.loads(txn.get(key))``, environment opened per process."""

    def __init__(self, root: Path, n: int) -> None:
        self.root, self.n = root, n
        self._txn: Any = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self._txn is None:
            env = lmdb.open(str(self.root), readonly=True, lock=False, readahead=False)
            self._txn = env.begin()
        return pickle.loads(self._txn.get(int(i).to_bytes(8, "big")))


class PlainLmdbMembers(PlainLmdb):
    """Plain ``lmdb`` on pickleshard's LMDB output: ``get`` of the two member keys
    (``f"{i:010d}.x.npy"``, ``f"{i:010d}.y.cls"``), ``np.load`` and ``int``."""

    def __getitem__(self, i: int) -> Any:
        if self._txn is None:
            env = lmdb.open(str(self.root), readonly=True, lock=False, readahead=False)
            self._txn = env.begin()
        key = f"{int(i):010d}."
        x = self._txn.get(f"{key}x.npy".encode())
        return np.load(io.BytesIO(x)), int(self._txn.get(f"{key}y.cls".encode()))


def _epoch(loader: Iterable[Any]) -> int:
    count = 0
    for _, y in loader:
        count += len(y)
    return count


def _map_epoch(ds: Any) -> Callable[[], int]:
    def run() -> int:
        return _epoch(DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=0))

    return run


def _plain_wds(root: Path, shards: int) -> Callable[[], int]:
    urls = str(root / f"shard-{{000000..{shards - 1:06d}}}.tar")

    def run() -> int:
        ds = wds.WebDataset(urls, shardshuffle=shards, empty_check=False)
        pipeline = ds.shuffle(1000).decode().to_tuple("x.npy", "y.cls")
        return _epoch(DataLoader(pipeline, batch_size=BATCH, num_workers=0))

    return run


# ---- the run ----------------------------------------------------------------------------------


def _conversions(spec: DataSpec, work: Path, jobs: int) -> list[Row]:
    paths, n = spec.paths, spec.num_samples
    nbytes = sum(p.stat().st_size for p in paths)
    rows = [Row("convert", "index build (once per dataset, whole-file)", _timed(lambda: build_index(spec.directory, jobs=1)), n, nbytes)]  # fmt: skip
    plans: list[tuple[str, Callable[[], Any]]] = [
        ("naive memmap: load + open_memmap", lambda: naive_memmap(paths, work / "naive-memmap", n, spec.shape)),
        ("pickleshard memmap, jobs=1", lambda: convert(spec.directory, work / "memmap-1", jobs=1)),
        (f"pickleshard memmap, jobs={jobs}", lambda: convert(spec.directory, work / "memmap", jobs=jobs)),
        ("naive LMDB: load + put(pickle)", lambda: naive_lmdb(paths, work / "naive-lmdb")),
        ("pickleshard LMDB, jobs=1", lambda: convert(spec.directory, work / "lmdb-1", to="lmdb", jobs=1)),
        (f"pickleshard LMDB, jobs={jobs}", lambda: convert(spec.directory, work / "lmdb", to="lmdb", jobs=jobs)),
        ("naive WebDataset: load + ShardWriter", lambda: naive_webdataset(paths, work / "naive-wds")),
        ("pickleshard WebDataset, jobs=1", lambda: convert(spec.directory, work / "wds-1", to="webdataset", jobs=1, shard_bytes=SHARD_BYTES)),
        (f"pickleshard WebDataset, jobs={jobs}", lambda: convert(spec.directory, work / "wds", to="webdataset", jobs=jobs, shard_bytes=SHARD_BYTES)),
        ("pickleshard verify memmap (stored digests)", lambda: verify(None, work / "memmap")),
        *arrow_conversions(spec.directory, paths, work, jobs),
    ]  # fmt: skip
    for name, fn in plans:
        rows.append(Row("convert", name, _timed(fn), n, nbytes))
        print(f"  {name}: {rows[-1].seconds:.2f} s", flush=True)
    for name in ("memmap-1", "lmdb-1", "wds-1"):
        shutil.rmtree(work / name)
    return rows


def _reads(spec: DataSpec, work: Path) -> list[Row]:
    n = spec.num_samples
    sample_bytes = int(np.prod(spec.shape)) * 4 + 8
    shards = len(json.loads((work / "wds" / "pickleshard.json").read_text())["shards"])
    # lmdb opens a path once per process and pickleshard's reader holds "lmdb": a copy for plain
    shutil.copytree(work / "lmdb", work / "lmdb-plain")
    plans: list[tuple[str, Callable[[], int]]] = [
        ("raw np.memmap, __getitem__", _map_epoch(RawMemmap(work / "memmap"))),
        ("raw np.memmap, __getitems__ (fancy index)", _map_epoch(RawMemmapBatched(work / "memmap"))),
        ("pickleshard memmap (open_dataset)", _map_epoch(open_dataset(work / "memmap"))),
        ("plain LMDB, pickle.loads per key", _map_epoch(PlainLmdb(work / "naive-lmdb", n))),
        ("plain LMDB on pickleshard's output, get + np.load", _map_epoch(PlainLmdbMembers(work / "lmdb-plain", n))),
        ("pickleshard LMDB (open_dataset)", _map_epoch(open_dataset(work / "lmdb"))),
        ("plain webdataset: shuffle(1000).decode()", _plain_wds(work / "wds", shards)),
        ("pickleshard WebDataset (buffer 1000)", lambda: _epoch(DataLoader(open_dataset(work / "wds", buffer_size=1000), batch_size=BATCH))),
        *arrow_reads(work, _map_epoch),
    ]  # fmt: skip
    rows = []
    for name, fn in plans:
        fn()  # warm-up epoch: page cache, decoder caches
        t0 = time.perf_counter()
        seen = fn()
        rows.append(Row("read", name, time.perf_counter() - t0, seen, seen * sample_bytes))
        print(f"  {name}: {seen / rows[-1].seconds:,.0f} samples/s", flush=True)
        if seen != n:
            raise RuntimeError(f"{name} read {seen} samples, expected {n}")
    return rows


_SPLIT_CHILD = {
    "pickleshard split": "from pickleshard.pipelines.split.run import split\n"
    "split(SRC, OUT, max_bytes=CHUNK)",
    "naive split: pickle.load whole + dump slices": "import os, pickle\n"
    "xs, ys = pickle.load(open(SRC, 'rb'))\n"
    "per = max(1, CHUNK * len(xs) // os.path.getsize(SRC))\n"
    "os.makedirs(OUT)\n"
    "for k in range(0, len(xs), per):\n"
    "    with open(f'{OUT}/part-{k // per:05d}.pickle', 'wb') as fh:\n"
    "        pickle.dump((xs[k:k + per], ys[k:k + per]), fh, protocol=5)",
}
SPLIT_CHUNK = 64 << 20


def _splits(spec: DataSpec, work: Path) -> list[Row]:
    """One pickle of the whole dataset, split into 64 MiB chunks by pickleshard and by the naive
    load-and-dump loop, each in a fresh process whose peak PSS is sampled from outside."""
    from pickleshard.pipelines.memory import tree_pss

    big = work / "big.pickle"
    xs: list[Any] = []
    ys: list[int] = []
    for path in spec.paths:
        a, b = _load(path)
        xs += a
        ys += b
    with open(big, "wb") as fh:
        pickle.dump((xs, ys), fh, protocol=5)
    del xs, ys
    size = big.stat().st_size
    rows = []
    for k, (name, body) in enumerate(_SPLIT_CHILD.items()):
        out = work / f"split-{k}"
        code = f"SRC, OUT, CHUNK = {str(big)!r}, {str(out)!r}, {SPLIT_CHUNK}\n{body}"
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", code])
        peak = 0
        while proc.poll() is None:
            with contextlib.suppress(Exception):  # the process may be exiting
                peak = max(peak, tree_pss(proc.pid))
            time.sleep(0.02)
        rc = proc.returncode
        seconds = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"{name} exited with {rc}")
        parts = len(list(out.glob("*.pickle")))
        note = f"{parts} chunks; peak PSS {peak / 1e6:,.0f} MB"
        rows.append(Row("split", name, seconds, spec.num_samples, size, note, peak))
        print(f"  {name}: {seconds:.2f} s, {note}", flush=True)
        shutil.rmtree(out)
    big.unlink()
    return rows


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _tables(rows: Sequence[Row]) -> list[str]:
    conv = [r for r in rows if r.table == "convert"]
    naive = {f: next(r for r in conv if r.name.startswith(f"naive {f}")) for f in FORMATS}
    out = ["| conversion | seconds | s/GB of pickles | speed vs naive |", "|---|---:|---:|---:|"]
    for r in conv:
        fmt = next((f for f in FORMATS if r.name.startswith(f"pickleshard {f},")), None)
        speed = f"{naive[fmt].seconds / r.seconds:.2f}x" if fmt else ""
        out.append(f"| {r.name} | {r.seconds:.2f} | {r.seconds / (r.nbytes / 1e9):.1f} | {speed} |")
    reads = [r for r in rows if r.table == "read"]
    best_raw = max(r.samples / r.seconds for r in reads if r.name.startswith("raw"))
    out += [
        "",
        "| shuffled epoch (DataLoader, batch 256, 0 workers) | samples/s | MB/s | vs best raw np.memmap |",
        "|---|---:|---:|---:|",
    ]
    for r in reads:
        rate = r.samples / r.seconds
        out.append(
            f"| {r.name} | {rate:,.0f} | {r.nbytes / r.seconds / 1e6:,.0f} | {rate / best_raw:.2f}x |"
        )
    splits = [r for r in rows if r.table == "split"]
    if splits:
        out += [
            "",
            f"| split one {splits[0].nbytes / 1e6:,.0f} MB pickle into {SPLIT_CHUNK >> 20} MiB chunks (fresh process, wall time) | seconds | s/GB | peak PSS (MB) | peak PSS / file size |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in splits:
            out.append(
                f"| {r.name} | {r.seconds:.2f} | {r.seconds / (r.nbytes / 1e9):.1f} | {r.peak_pss / 1e6:,.0f} | {r.peak_pss / r.nbytes:.2f} |"
            )
    mine = next(r for r in reads if r.name.startswith("pickleshard memmap"))
    ratio = mine.samples / mine.seconds / best_raw
    verdict = "met" if ratio >= 0.9 else "NOT met"
    out += ["", f"Target: pickleshard memmap >= 0.9x the best raw np.memmap row: **{ratio:.2f}x, {verdict}**."]  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m bench.convert", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (4 files x 250)")
    parser.add_argument("--small", action="store_true", help="4 files x 2500 samples")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--data", type=Path, default=HERE / "data", help="where datasets live")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", help="results file name (default convert[-quick])")
    args = parser.parse_args(argv)
    files, per_file = SIZES["quick" if args.quick else "small" if args.small else "full"]
    spec = DataSpec(args.data, files, per_file, (3, 32, 32))
    machine = describe_machine(
        shlex.join([sys.executable, "-m", "bench.convert", *(argv or sys.argv[1:])])
    )
    ensure_data(spec)
    work = args.data / f"convert-{spec.name}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        print(f"converting {spec.directory} ({spec.num_samples} samples)", flush=True)
        rows = _conversions(spec, work, args.jobs)
        sizes = {name: _size(work / name) for name in ("memmap", "lmdb", "wds", "naive-memmap", "naive-lmdb", "naive-wds", *ARROW_NAMES)}  # fmt: skip
        print("reading", flush=True)
        rows += _reads(spec, work)
        print("splitting", flush=True)
        rows += _splits(spec, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    source = sum(p.stat().st_size for p in spec.paths)
    name = args.name or ("convert-quick" if args.quick else "convert")
    lines = report_head(f"Conversion and converted-format readers ({spec.name})", machine)
    lines += ["", "## Setup", "", f"- {spec.num_samples} samples in {files} files, {source / 1e6:,.0f} MB of pickles; index built before conversion rows; outputs in the page cache when read"]  # fmt: skip
    lines += ["- output sizes (MB): " + ", ".join(f"{k} {v / 1e6:,.0f}" for k, v in sizes.items())]
    lines += ["", "## Results", "", *_tables(rows), ""]
    raw = {"machine": machine, "sizes": sizes, "rows": [asdict(r) for r in rows]}
    save_results(args.out, name, lines, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
