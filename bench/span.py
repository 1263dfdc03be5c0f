"""``python -m bench.span`` (or ``python -m bench span``): shuffled epochs by span vs numpy memmap.

Part 1, speed. The same samples, read two ways in one process, side by side:

- **span**: ``PickleDataset(mode="span")`` over the original pickles (``pickle.dump((x_list,
  y_list))`` per file): every sample's byte span read through its byte source (``LocalFile``,
  ``pread``) and unpickled alone.
- **memmap**: the converted data a user would otherwise train from, a numpy memmap ``Dataset``:
  for arrays ``x.npy`` ``(N, 3, 32, 32)`` float32 and ``y.npy`` opened with ``mmap_mode="r"``,
  ``ds[i] = (np.array(x[i]), int(y[i]))``; for Python objects (which no ``.npy`` holds) the
  pickled bytes of each sample in one ``uint8`` memmap plus an offsets array, ``ds[i] =
  pickle.loads(blob[off[i]:off[i+1]])``.

Each is run per sample (the loader calls ``ds[i]`` for every index: both datasets are wrapped
in the same object that hides ``__getitems__``) and per batch (``__getitems__``; the memmap's
reads the batch with one sorted fancy index, ``x[np.sort(idx)]``, the objects' memmap slices in
sorted order). Every epoch goes through ``DataLoader(ds, batch_size=64,
sampler=RandomSampler(ds), num_workers=0)``: the default collate for arrays, a list for objects
(variable-length token lists do not stack). Methods are interleaved, repeated ``--repeat``
times, best kept. Targets (issue 3): span per sample >= 0.8x memmap per sample; span
``__getitems__`` >= 0.5x memmap fancy index per batch.

The cost of the read checks (issue 12: an array's framing read with its payload and compared,
``fstat`` of the file after every read or batch), at most 3% on 12 KB samples: the span dataset
is read with the checks on and off (``span_files.verify = False``, a switch only this
benchmark uses), ``ds[i]`` one by one and ``__getitems__`` in batches of 64, over one shuffled
epoch cut into blocks of 1024 samples; each block is read both ways, in alternating order, and
timed in CPU time of the thread (``time.thread_time``: syscalls included, time spent waiting
for a busy CPU not), so other processes on the machine hardly move the ratio; best of
``--repeat`` per block, summed.

Part 2, memory: one file far larger than the cache budget (``--big-gb``, 12 KB samples),
a shuffled span epoch of ``--big-samples`` samples with 2 DataLoader workers, in a fresh process:
PSS summed over the process and its workers, sampled every 50 ms, against the 256 MiB budget
the issue names and the file's size.

Writes ``bench/results/span-vs-memmap[-quick].md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from pickleshard import PickleDataset, build_index
from pickleshard.scan import ENGINE

from .baselines import RawMemmap
from .report import describe_machine, report_head, save_results
from .scan import DataSet

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
MiB = 1 << 20
BATCH = 64
BUDGET = 256 * MiB

FULL = (
    DataSet("12 KB arrays, float32 3x32x32", "arrays", 8, 5000),
    DataSet("Python objects (dict of list, str, float)", "objects", 8, 5000),
)
QUICK = (
    DataSet("12 KB arrays, float32 3x32x32", "arrays", 2, 500),
    DataSet("Python objects (dict of list, str, float)", "objects", 2, 500),
)


# ---- the memmap baseline ---------------------------------------------------------------------


def _memmap_dir(ds: DataSet, root: Path) -> Path:
    """Convert ``ds`` once (untimed) to plain ``.npy`` files beside it; return their folder."""
    out = root / f"{ds.name}.memmap"
    if (out / "y.npy").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    xs: list[Any] = []
    ys: list[int] = []
    for p in ds.paths(root):
        with open(p, "rb") as fh:
            x, y = pickle.load(fh)
        xs.extend(x)
        ys.extend(y)
    if ds.kind == "arrays":
        np.save(tmp / "x.npy", np.stack(xs))
    else:
        blobs = [pickle.dumps(x, protocol=5) for x in xs]
        np.save(tmp / "off.npy", np.cumsum([0, *map(len, blobs)], dtype=np.int64))
        np.save(tmp / "blob.npy", np.frombuffer(b"".join(blobs), dtype=np.uint8))
    np.save(tmp / "y.npy", np.asarray(ys, dtype=np.int64))
    tmp.rename(out)
    return out


class MemmapArrays(RawMemmap):
    """:class:`bench.baselines.RawMemmap` plus one sorted fancy index per batch."""

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, int]]:
        idx = np.asarray(indices, dtype=np.int64)
        order = np.argsort(idx, kind="stable")
        xs, ys = self.x[idx[order]], self.y[idx[order]].tolist()
        out: list[Any] = [None] * len(idx)
        for k, j in enumerate(order.tolist()):
            out[j] = (xs[k], ys[k])
        return out


class MemmapPickles(Dataset[Any]):
    """Per-sample pickles in one ``uint8`` memmap + offsets; a batch is sliced in sorted order."""

    def __init__(self, folder: Path) -> None:
        self.blob = np.load(folder / "blob.npy", mmap_mode="r")
        self.off = np.load(folder / "off.npy", mmap_mode="r")
        self.y = np.load(folder / "y.npy", mmap_mode="r")

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        a, b = int(self.off[i]), int(self.off[i + 1])
        return pickle.loads(self.blob[a:b]), int(self.y[i])

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, int]]:
        idx = np.asarray(indices, dtype=np.int64)
        order = np.argsort(idx, kind="stable")
        srt = idx[order]
        starts, ends, ys = self.off[srt].tolist(), self.off[srt + 1].tolist(), self.y[srt].tolist()
        out: list[Any] = [None] * len(idx)
        for k, j in enumerate(order.tolist()):
            out[j] = (pickle.loads(self.blob[starts[k] : ends[k]]), ys[k])
        return out


class PerSample(Dataset[Any]):
    """``dataset`` with ``__getitems__`` hidden: the loader fetches sample by sample."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


def _epoch(dataset: Any, collate: Callable[[list[Any]], Any] | None, seed: int) -> float:
    """Seconds for one shuffled epoch through the DataLoader (``num_workers=0``)."""
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    kwargs: dict[str, Any] = {"collate_fn": collate} if collate is not None else {}
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=0, **kwargs)
    n = 0
    t0 = time.perf_counter()
    for batch in loader:
        n += len(batch) if collate is not None else int(batch[0].shape[0])
    seconds = time.perf_counter() - t0
    if n != len(dataset):
        raise AssertionError(f"epoch saw {n} samples of {len(dataset)}")
    return seconds


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@dataclass(frozen=True)
class SpeedRow:
    """Best-of-``repeat`` epoch seconds of each method on one dataset."""

    dataset: str
    samples: int
    memmap_item_s: float
    span_item_s: float
    memmap_batch_s: float
    span_batch_s: float
    # CPU seconds per epoch of ds[i] / __getitems__ outside the loader, read checks on and off
    checks_item_s: float = float("nan")
    unchecked_item_s: float = float("nan")
    checks_batch_s: float = float("nan")
    unchecked_batch_s: float = float("nan")


def _speed(ds: DataSet, root: Path, repeat: int) -> SpeedRow:
    paths = ds.paths(root)
    folder = _memmap_dir(ds, root)
    build_index(paths[0].parent)  # the span index (opcode scan, nothing unpickled)
    span = PickleDataset(paths[0].parent, mode="span", rebuild="auto")
    unchecked = PickleDataset(paths[0].parent, mode="span", rebuild="never")
    unchecked.span_files.verify = False  # the read checks off: what they cost
    memmap: Any = MemmapArrays(folder) if ds.kind == "arrays" else MemmapPickles(folder)
    if len(span) != len(memmap):
        raise AssertionError(f"{len(span)} span samples vs {len(memmap)} in the memmap")
    rng = np.random.default_rng(0)
    for i in rng.integers(0, len(span), size=64).tolist():  # the same data, both ways
        if not _same(span[i], memmap[i]):
            raise AssertionError(f"sample {i} differs between span and memmap")
    for p in [*paths, *folder.iterdir()]:  # into the page cache
        p.read_bytes()
    collate = None if ds.kind == "arrays" else _as_list
    methods = {
        "memmap_item_s": PerSample(memmap),
        "span_item_s": PerSample(span),
        "memmap_batch_s": memmap,
        "span_batch_s": span,
    }
    best = dict.fromkeys(methods, float("inf"))
    for rep in range(repeat):
        for name, dataset in methods.items():
            best[name] = min(best[name], _epoch(dataset, collate, seed=rep))
        print(
            "   " + ", ".join(f"{k[:-2]} {len(span) / v:,.0f}/s" for k, v in best.items()),
            flush=True,
        )
    costs = _check_cost(span, unchecked, repeat)
    return SpeedRow(dataset=ds.label, samples=len(span), **best, **costs)


def _check_cost(checked: Any, unchecked: Any, repeat: int) -> dict[str, float]:
    """CPU seconds of one shuffled epoch read with the checks on and off (see the module doc)."""
    order = np.random.default_rng(3).permutation(len(checked)).tolist()
    blocks = [order[a : a + 1024] for a in range(0, len(order), 1024)]

    def items(ds: Any, block: list[int]) -> None:
        for i in block:
            ds[i]

    def batches(ds: Any, block: list[int]) -> None:
        for a in range(0, len(block), BATCH):
            ds.__getitems__(block[a : a + BATCH])

    for ds in (checked, unchecked):  # readers open, fields settled, plans made: not timed
        items(ds, order[:256])
        batches(ds, order[:256])
    out = {}
    for name, read in (("item", items), ("batch", batches)):
        best = {True: [float("inf")] * len(blocks), False: [float("inf")] * len(blocks)}
        for rep in range(repeat):
            for b, block in enumerate(blocks):
                for on in (True, False) if (rep + b) % 2 else (False, True):
                    t0 = time.thread_time()
                    read(checked if on else unchecked, block)
                    best[on][b] = min(best[on][b], time.thread_time() - t0)
        out[f"checks_{name}_s"], out[f"unchecked_{name}_s"] = sum(best[True]), sum(best[False])
    return out


# ---- memory on one big file ------------------------------------------------------------------

_BIG_CHILD = """
import json, sys, time, torch
from torch.utils.data import DataLoader, RandomSampler
from pickleshard import PickleDataset
sys.path.insert(0, sys.argv[4])
from bench.measure import PeakTreeMemory, tree_memory
folder, samples, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
idle = tree_memory()
ds = PickleDataset(folder, mode="span", rebuild="never")
sampler = RandomSampler(ds, num_samples=samples, generator=torch.Generator().manual_seed(0))
loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=workers)
n, t0 = 0, time.perf_counter()
with PeakTreeMemory(0.05) as mem:
    for xb, _ in loader:
        n += int(xb.shape[0])
print(json.dumps({"samples": n, "seconds": time.perf_counter() - t0, "idle_pss": idle.pss,
    "start_pss": mem.start.pss, "peak_pss": mem.peak_pss, "start_alone": mem.start.alone,
    "peak_alone": mem.peak_alone, "memory_samples": mem.samples, "workers": workers,
    "num_samples": len(ds)}))
"""


def _big_memory(root: Path, gb: float, samples: int, workers: int) -> dict[str, Any]:
    per_file = int(gb * 1e9 / (3 * 32 * 32 * 4)) + 1
    big = DataSet("big", "arrays", 1, per_file)
    path = big.paths(root)[0]
    t0 = time.perf_counter()
    build_index(path.parent)
    index_s = time.perf_counter() - t0
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _BIG_CHILD,
            str(path.parent),
            str(samples),
            str(workers),
            *[str(HERE.parent)],
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    got.update(file=path.name, file_bytes=path.stat().st_size, index_s=index_s)
    return got


# ---- report ----------------------------------------------------------------------------------


def _rate(n: int, s: float) -> str:
    return f"{n / s:,.0f}"


def _speed_lines(rows: list[SpeedRow]) -> list[str]:
    head = ["dataset", "samples", "memmap per sample /s", "span per sample /s", "span / memmap"]
    head += ["memmap sorted fancy index per batch /s", "span `__getitems__` /s", "span / memmap"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [r.dataset, f"{r.samples:,}"]
        cells += [_rate(r.samples, r.memmap_item_s), _rate(r.samples, r.span_item_s)]
        cells += [f"{r.memmap_item_s / r.span_item_s:.2f}x"]
        cells += [_rate(r.samples, r.memmap_batch_s), _rate(r.samples, r.span_batch_s)]
        cells += [f"{r.memmap_batch_s / r.span_batch_s:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in rows:
        for what, ratio, goal in (
            ("per sample", r.memmap_item_s / r.span_item_s, 0.8),
            ("per batch", r.memmap_batch_s / r.span_batch_s, 0.5),
        ):
            verdict = "met" if ratio >= goal else "NOT met"
            lines.append(f"- {r.dataset}, {what}: {ratio:.2f}x (target ≥ {goal}x): {verdict}")
    return lines


def _check_lines(rows: list[SpeedRow]) -> list[str]:
    """Per-sample CPU time with the read checks on and off, side by side."""
    lines = [
        "| dataset | path | checks off CPU µs/sample | checks on CPU µs/sample | cost |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        for what, on, off in (
            ("per sample (`ds[i]`)", r.checks_item_s, r.unchecked_item_s),
            ("per batch (`__getitems__`, 64)", r.checks_batch_s, r.unchecked_batch_s),
        ):
            on_us, off_us = on / r.samples * 1e6, off / r.samples * 1e6
            cells = [r.dataset, what, f"{off_us:.2f}", f"{on_us:.2f}", f"{on / off - 1:+.1%}"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _memory_lines(m: dict[str, Any]) -> list[str]:
    growth = m["peak_pss"] - m["start_pss"]
    lines = [
        "| file | file size | samples in file | samples read | workers | samples/s "
        "| PSS before epoch MiB | peak PSS MiB | PSS growth MiB | peak alone MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {m['file']} | {m['file_bytes'] / 1e9:.2f} GB | {m['num_samples']:,} | "
        f"{m['samples']:,} | {m['workers']} | {m['samples'] / m['seconds']:,.0f} | "
        f"{m['start_pss'] / MiB:,.0f} | {m['peak_pss'] / MiB:,.0f} | {growth / MiB:+,.0f} | "
        f"{m['peak_alone'] / MiB:,.0f} |",
        "",
        f"- index build (opcode scan) of the file: {m['index_s']:.1f} s",
        f"- PSS growth during the epoch {growth / MiB:,.0f} MiB vs the 256 MiB budget: "
        f"{'met' if growth <= BUDGET else 'NOT met'}; the file is "
        f"{m['file_bytes'] / MiB:,.0f} MiB",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m bench.span", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    parser.add_argument("--repeat", type=int, default=3, help="epochs per method; best kept")
    parser.add_argument("--big-gb", type=float, default=3.0, help="size of the big file (GB)")
    parser.add_argument("--big-samples", type=int, default=100_000, help="samples read from it")
    parser.add_argument("--no-big", action="store_true", help="skip the big-file memory run")
    parser.add_argument("--data", type=Path, default=HERE / "data", help="where datasets live")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    if ENGINE != "compiled":
        print("note: the compiled scanner is not built; span rewrites run in pure Python")
    command = shlex.join(["python", "-m", "bench.span", *(sys.argv[1:] if argv is None else argv)])
    machine = describe_machine(command)
    rows = []
    for ds in QUICK if args.quick else FULL:
        print(f"-- {ds.label}", flush=True)
        rows.append(_speed(ds, args.data, 1 if args.quick else args.repeat))
    mem = None
    if not args.no_big:
        gb, n = (0.05, 2000) if args.quick else (args.big_gb, args.big_samples)
        print(f"-- one {gb} GB file, {n:,} shuffled samples, 2 workers", flush=True)
        mem = _big_memory(args.data, gb, n, 2)
    machine["load average at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    name = "span-vs-memmap-quick" if args.quick else "span-vs-memmap"
    lines = report_head(
        "Shuffled epochs by span from the original pickles vs numpy memmap", machine
    )
    lines += ["", "## Setup", "", *(__doc__ or "").strip().splitlines()[2:-2]]
    lines += ["", "## Shuffled epoch, num_workers=0", "", *_speed_lines(rows)]
    lines += ["", "## The cost of the read checks (framing, fstat)", "", *_check_lines(rows)]
    if mem is not None:
        lines += ["", "## One file far larger than the budget, shuffled, by span", ""]
        lines += _memory_lines(mem)
    lines.append("")
    raw = {"machine": machine, "rows": [asdict(r) for r in rows], "memory": mem}
    save_results(args.out, name, lines, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
