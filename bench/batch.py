"""``python -m bench batch``: a shuffled batch of 64, read and collated, every way side by side.

The data (written once under ``--data``): ``pickle.dump((x_list, y_list))`` files of
float32 ``(3, 32, 32)`` arrays (12 KB) and int labels; of float32 ``(100, 1000)`` arrays (400 KB);
and of small objects (dicts of a token list, a string, a float). For the arrays, a numpy memmap
holding the same arrays stacked is the ceiling. Rows, in one process, the same shuffled batches,
best of ``--rounds`` (3), rounds interleaved so that the machine's other load falls on every row:

- **memmap fancy index** (the ceiling): ``torch.from_numpy(x[np.sort(b)])``, labels likewise;
- **naive list + default_collate**: every file ``pickle.load``-ed into one list;
- **memmap per sample + default_collate**: ``(x[i], int(y[i]))`` each;
- **PickleDataset ds[i] + default_collate**;
- **PickleDataset.__getitems__ + default_collate** (what ``DataLoader`` does by default);
- **PickleDataset.__getitems__ + pickleshard.collate** (the batch read);
- the same with the span checks off (framing, identity), and ``ds[i]`` likewise: the checks'
  cost, per batch and per sample, stated under each table: in pairs (the same batches with
  and without, one after the other: the median of 60 pairs), and from the best rows;
- ``DataLoader(batch_size=64, num_workers=W, persistent_workers=True)`` with
  ``pickleshard.collate`` against the naive list, for ``--workers`` (0, 2), after an untimed
  warm-up epoch (workers started: their start-up is in neither row).

``--cold`` adds, for the 12 KB arrays: a shuffled epoch of batch reads with every file evicted
from the page cache first (``POSIX_FADV_DONTNEED``), against the whole-file cold epoch (each file
``pickle.load``-ed then indexed, the naive way), bytes fetched from ``/proc/self/io``
(``read_bytes``), the same batches through :class:`pickleshard.Loader` (its default, and 4
threads reading ahead; the issue's target: >= 1.2x the whole-file cold epoch), and the disk's
random-read floor (4 KiB ``pread`` at random offsets, evicted).

Every in-process row is given per second of wall-clock time and per second of the thread's CPU
time: on a machine shared with other work the second is the steadier (the ``DataLoader`` rows
have no CPU-time figure: with workers, their work runs in other processes).

Writes ``bench/results/batch-reads[-quick].md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

import pickleshard
from pickleshard import PickleDataset

from .report import describe_machine, report_head, save_results

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
BATCH = 64


# -- data ---------------------------------------------------------------------------------------


def _write(folder: Path, files: int, per_file: int, kind: str) -> Path:
    done = folder / ".written"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for f in range(files):
        if kind == "objects":
            xs: list[Any] = [
                {
                    "tokens": rng.integers(0, 30000, 16).tolist(),
                    "text": f"sample {f}-{k}",
                    "score": float(rng.random()),
                }
                for k in range(per_file)
            ]
        else:
            shape = (3, 32, 32) if kind == "12KB" else (100, 1000)
            xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(per_file)]
        ys = [int(v) for v in rng.integers(0, 10, per_file)]
        with open(folder / f"part{f:03d}.pkl", "wb") as fh:
            pickle.dump((xs, ys), fh, protocol=4)
    done.touch()
    return folder


def _memmap(folder: Path, naive: list[tuple[Any, Any]]) -> tuple[np.ndarray, np.ndarray]:
    path = folder.with_suffix(".npy")
    if not path.exists():
        np.save(path, np.stack([x for x, _ in naive]))
    return np.load(path, mmap_mode="c"), np.asarray([y for _, y in naive], np.int64)


def _naive(folder: Path) -> list[tuple[Any, Any]]:
    out: list[tuple[Any, Any]] = []
    for path in sorted(folder.glob("*.pkl")):
        with open(path, "rb") as fh:
            xs, ys = pickle.load(fh)
        out.extend(zip(xs, ys, strict=True))
    return out


# -- rows ---------------------------------------------------------------------------------------


def _epoch(batches: list[list[int]], read: Callable[[list[int]], Any]) -> tuple[float, float]:
    """Samples/s of reading ``batches`` with ``read`` (its result touched, as a loop would):
    per second of wall-clock time, and per second of this thread's CPU time (what the row costs
    whatever else runs on a shared machine: these rows run in this one thread, page faults and
    copies included, with no waits for the device on a warm page cache)."""
    start, cpu = time.perf_counter(), time.thread_time()
    n = 0
    for b in batches:
        got = read(b)
        n += len(b)
        del got
    return n / (time.perf_counter() - start), n / max(time.thread_time() - cpu, 1e-9)


def _loader_epoch(loader: DataLoader[Any]) -> float:
    start = time.perf_counter()
    n = 0
    for batch in loader:
        n += len(batch[-1])  # the labels: one per sample, whatever the first field is
    return n / (time.perf_counter() - start)


def _paired(
    rows: dict[str, Callable[[list[int]], Any]], batches: list[list[int]]
) -> dict[str, list[float]]:
    """The checks' cost measured in pairs: for each :data:`CHECKED` row and its twin, the same
    :data:`PAIR_BATCHES` batches read with the checks and without, one right after the other
    (which goes first alternates), :data:`PAIRS` times (round the epoch again where it is
    short); each pair's CPU
    time with the checks over without, less one. Two best-of rows measured a minute apart
    moved the difference by ten points here; a pair shares the machine's state."""
    out: dict[str, list[float]] = {}
    for what, (on, off) in CHECKED.items():
        ratios = []
        runs = len(batches) // PAIR_BATCHES
        for k in range(PAIRS if runs else 0):
            at = k % runs * PAIR_BATCHES  # round the epoch again where it is short
            part = batches[at : at + PAIR_BATCHES]
            first, second = (on, off) if k % 2 == 0 else (off, on)
            a, b = _epoch(part, rows[first])[1], _epoch(part, rows[second])[1]
            with_checks, without = (a, b) if first == on else (b, a)
            ratios.append(without / with_checks - 1)  # samples per CPU-second: time ratio
        out[what] = ratios
    return out


PAIR_BATCHES = 40  # batches per pair of the paired checks' cost
PAIRS = 60  # pairs


def _rows(
    kind: str, folder: Path, rounds: int, workers: tuple[int, ...], batches_max: int
) -> tuple[dict[str, float], dict[str, float], dict[str, list[float]]]:
    """Each row's best samples/s by wall-clock time, and by CPU time (in-process rows only),
    and the checks' cost in pairs (:func:`_paired`)."""
    naive = _naive(folder)
    ds = PickleDataset(folder, jobs=1)
    unchecked = PickleDataset(folder, jobs=1)
    unchecked.span_files.verify = False
    n = len(ds)
    order = np.random.default_rng(1).permutation(n)
    batches = [order[i : i + BATCH].tolist() for i in range(0, n - BATCH + 1, BATCH)][:batches_max]
    rows: dict[str, Callable[[list[int]], Any]] = {}
    if kind != "objects":
        xm, ym = _memmap(folder, naive)
        rows["memmap fancy index (ceiling)"] = lambda b: (
            torch.from_numpy(xm[np.sort(b)]),
            torch.from_numpy(ym[np.sort(b)]),
        )
        rows["memmap per sample + default_collate"] = lambda b: default_collate(
            [(xm[i], int(ym[i])) for i in b]
        )
    rows["naive list + default_collate"] = lambda b: default_collate([naive[i] for i in b])
    rows["ds[i] + default_collate"] = lambda b: default_collate([ds[i] for i in b])
    rows["ds[i], checks off"] = lambda b: default_collate([unchecked[i] for i in b])
    rows["__getitems__ + default_collate"] = lambda b: default_collate(list(ds.__getitems__(b)))
    # looked up once, as DataLoader(collate_fn=pickleshard.collate) does: pickleshard's lazy
    # top-level names are imported on each attribute access
    collate = pickleshard.collate
    rows["__getitems__ + pickleshard.collate"] = lambda b: collate(ds.__getitems__(b))
    rows["same, checks off"] = lambda b: collate(unchecked.__getitems__(b))
    for read in rows.values():  # warm: page cache, plans, readers
        _epoch(batches[:4], read)
    best = dict.fromkeys(rows, 0.0)
    best_cpu = dict.fromkeys(rows, 0.0)
    for r in range(rounds):
        names = list(rows) if r % 2 == 0 else list(rows)[::-1]
        for name in names:
            wall, cpu = _epoch(batches, rows[name])
            best[name], best_cpu[name] = max(best[name], wall), max(best_cpu[name], cpu)
    paired = _paired(rows, batches)
    sampler = order[: len(batches) * BATCH].tolist()
    for w in workers:
        ours = DataLoader(
            ds,
            batch_size=BATCH,
            sampler=sampler,
            collate_fn=pickleshard.collate,
            num_workers=w,
            persistent_workers=w > 0,
        )
        theirs: DataLoader[Any] = DataLoader(
            naive,  # type: ignore[arg-type]
            batch_size=BATCH,
            sampler=sampler,
            num_workers=w,
            persistent_workers=w > 0,
        )
        for name, loader in (
            (f"DataLoader W={w}: naive list", theirs),
            (f"DataLoader W={w}: pickleshard.collate", ours),
        ):
            _loader_epoch(loader)  # workers started, pages warm: start-up is in no row
            best[name] = max(_loader_epoch(loader) for _ in range(max(1, rounds - 1)))
    return best, best_cpu, paired


# -- cold ---------------------------------------------------------------------------------------


def _evict(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_bytes() -> int:
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def _cold(folder: Path, batches_max: int) -> dict[str, Any]:
    paths = sorted(folder.glob("*.pkl"))
    ds = PickleDataset(folder, jobs=1)
    n = len(ds)
    order = np.random.default_rng(2).permutation(n)
    batches = [order[i : i + BATCH].tolist() for i in range(0, n - BATCH + 1, BATCH)][:batches_max]
    samples = len(batches) * BATCH
    sample_bytes = samples * (3 * 32 * 32 * 4 + 8)
    out: dict[str, Any] = {}
    ds.span_files.close()
    _evict(paths)
    b0, t0 = _read_bytes(), time.perf_counter()
    collate = pickleshard.collate
    for b in batches:
        collate(ds.__getitems__(b))
    t_span, b_span = time.perf_counter() - t0, _read_bytes() - b0
    ds.span_files.close()  # its mappings hold pages in the cache: let them go before evicting
    _evict(paths)
    b0, t0 = _read_bytes(), time.perf_counter()
    naive = _naive(folder)
    for b in batches:
        default_collate([naive[i] for i in b])
    t_whole, b_whole = time.perf_counter() - t0, _read_bytes() - b0
    del naive
    out["span epoch samples/s"] = samples / t_span
    out["whole-file epoch samples/s"] = samples / t_whole
    out["span / whole"] = t_whole / t_span
    out["span bytes fetched / sample bytes"] = b_span / sample_bytes
    out["whole bytes fetched / sample bytes"] = b_whole / sample_bytes
    # pickleshard.Loader over the same batches: its default for local files (read in the
    # loop's thread), then 4 threads reading ahead (a queue of reads for the disk)
    flat = [i for b in batches for i in b]
    for threads, name in ((None, "Loader (default)"), (4, "Loader (threads=4)")):
        ds.span_files.close()
        _evict(paths)
        b0, t0 = _read_bytes(), time.perf_counter()
        for _ in pickleshard.Loader(ds, BATCH, sampler=flat, threads=threads, prefetch=4):
            pass
        t_loader, b_loader = time.perf_counter() - t0, _read_bytes() - b0
        out[f"{name} epoch samples/s"] = samples / t_loader
        out[f"{name} / whole (target >= 1.2)"] = t_whole / t_loader
        out[f"{name} bytes fetched / sample bytes"] = b_loader / sample_bytes
    # the disk's random-read floor: 4 KiB preads at random offsets of an evicted file
    _evict(paths)
    fd = os.open(paths[0], os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        offs = np.random.default_rng(3).integers(0, size - 4096, 2000).tolist()
        t0 = time.perf_counter()
        for o in offs:
            os.pread(fd, 4096, o)
        out["disk random 4 KiB reads/s (queue depth 1)"] = len(offs) / (time.perf_counter() - t0)
    finally:
        os.close(fd)
    return out


# -- report -------------------------------------------------------------------------------------

# each checked row and its twin with the checks off
CHECKED = {
    "per batch": ("__getitems__ + pickleshard.collate", "same, checks off"),
    "per sample": ("ds[i] + default_collate", "ds[i], checks off"),
}


def _checks_cost(
    best: dict[str, float], cpu: dict[str, float], paired: dict[str, list[float]]
) -> list[str]:
    """The checks' cost (framing, identity): the time a row takes with them over the time
    without, less one: in pairs (median and quartiles, CPU time), and from the best rows, by
    CPU time and by wall-clock time."""
    out = []
    for what, (on, off) in CHECKED.items():
        by_cpu = cpu[off] / cpu[on] - 1
        by_wall = best[off] / best[on] - 1
        pairs = paired.get(what) or []
        in_pairs = (
            f"{float(np.median(pairs)):+.1%} in {len(pairs)} pairs of {PAIR_BATCHES} batches "
            f"(CPU time; quartiles {float(np.percentile(pairs, 25)):+.1%} to "
            f"{float(np.percentile(pairs, 75)):+.1%}); "
            if pairs
            else ""
        )
        out.append(
            f"- the checks' cost {what}: {in_pairs}from the best rows {by_cpu:+.1%} of the "
            f"time by CPU time, {by_wall:+.1%} by wall-clock time"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench batch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--data", type=Path, default=HERE / "data" / "batch")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--quick", action="store_true", help="small data, one round")
    parser.add_argument("--cold", action="store_true", help="add the evicted-cache rows")
    args = parser.parse_args(argv)
    workers = tuple(int(w) for w in args.workers.split(",") if w.strip())
    quick = args.quick
    sizes = {
        "12KB": (8, 5000) if not quick else (4, 500),
        "400KB": (4, 200) if not quick else (2, 50),
        "objects": (8, 5000) if not quick else (4, 500),
    }
    rounds = 1 if quick else args.rounds
    command = shlex.join(
        ["python", "-m", "bench", "batch", *(sys.argv[2:] if argv is None else argv)]
    )
    machine = describe_machine(command)
    raw: dict[str, Any] = {"machine": machine, "datasets": {}, "datasets_cpu": {}}
    lines = report_head("Batch-first reads: a shuffled batch of 64, read and collated", machine)
    for kind, (files, per_file) in sizes.items():
        folder = _write(args.data / f"{kind}-{files}x{per_file}", files, per_file, kind)
        best, cpu, paired = _rows(kind, folder, rounds, workers, 10_000 if kind != "400KB" else 100)
        raw["datasets"][kind], raw["datasets_cpu"][kind] = best, cpu
        raw.setdefault("checks_paired", {})[kind] = paired
        ceiling = best.get("memmap fancy index (ceiling)")
        naive = best["naive list + default_collate"]
        ceiling_cpu = cpu.get("memmap fancy index (ceiling)")
        naive_cpu = cpu["naive list + default_collate"]
        lines += [
            "",
            f"## {kind} ({files} files x {per_file})",
            "",
            "| path | samples/s | vs ceiling | vs naive list "
            "| samples/CPU-s | vs ceiling (CPU) | vs naive list (CPU) |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, rate in best.items():
            vs_c = f"{rate / ceiling:.2f}x" if ceiling else "-"
            c = cpu.get(name)
            by_cpu = "| - | - | -"
            if c is not None:
                vs_cc = f"{c / ceiling_cpu:.2f}x" if ceiling_cpu else "-"
                by_cpu = f"| {c:,.0f} | {vs_cc} | {c / naive_cpu:.2f}x"
            lines.append(f"| {name} | {rate:,.0f} | {vs_c} | {rate / naive:.2f}x {by_cpu} |")
        lines += ["", *_checks_cost(best, cpu, paired)]
    if args.cold:
        folder = args.data / f"12KB-{sizes['12KB'][0]}x{sizes['12KB'][1]}"
        cold = _cold(folder, 10_000)
        raw["cold"] = cold
        lines += ["", "## 12KB, cold (files evicted before each epoch)", ""]
        lines += [f"- {k}: {v:,.2f}" for k, v in cold.items()]
    name = "batch-reads-quick" if quick else "batch-reads"
    save_results(args.out, name, lines, raw)
    write_plot(raw, args.out / f"{name}.png")
    return 0


def write_plot(raw: dict[str, Any], path: Path) -> None:
    """Samples/s of every path, one panel per dataset, as a horizontal bar chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(raw["datasets"])
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 5))
    for ax, kind in zip(axes, kinds, strict=True):
        rows = raw["datasets"][kind]
        names = list(rows)[::-1]
        colors = [
            "tab:orange" if "pickleshard" in n or "__getitems__" in n else "tab:gray" for n in names
        ]
        ax.barh(names, [rows[n] for n in names], color=colors)
        ax.set_title(kind)
        ax.set_xlabel("samples/s (shuffled batches of 64)")
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
