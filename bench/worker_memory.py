"""``python -m bench.worker_memory``: each DataLoader worker's memory over one epoch.

The folk baseline (:class:`bench.baselines.FolkJsonDataset`: a JSON list of one dict per sample,
plus the last unpickled file) against :class:`pickleshard.PickleDataset` (per-sample data in a
memory-mapped numpy array), on the same files, in sequential order, ``num_workers=2``.

Why the folk one grows: a forked worker shares its parent's pages until it writes to one, and
merely *reading* a Python object writes its reference count. Walking the index dicts of an epoch
therefore copies, page by page, the whole index into every worker (pytorch/pytorch#13246).
PickleDataset reads numpy rows: no reference counts in the shared pages, nothing copied.

Each dataset runs in a fresh process. A thread samples every worker's USS (pages only it maps)
and PSS (shared pages divided among their users) every ``--interval`` seconds via psutil. The
measured span runs from the moment 20% of the epoch has arrived (past the workers' warm-up:
first touching the interpreter's own objects costs every worker tens of MiB, whatever the
dataset) to the last batch. Start is the least value over the span's first 15%, end the least
over its last 15%: floors, so that the transient peak of unpickling a file (two files and the
unpickler's memo alive at once) does not count as growth. Growth is end minus start. Prints a
table, writes ``worker_memory.json`` and the curves as ``worker_memory.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from .measure import MiB

__all__ = ["WorkerSeries", "main", "measure_epoch"]

HERE = Path(__file__).resolve().parent
Kind = Literal["folk", "pickleshard"]
KINDS: tuple[Kind, ...] = ("folk", "pickleshard")
WARMUP = 0.2  # growth is measured from here (a fraction of the epoch's samples) to its end
WINDOW = 0.15  # start and end are floors over this fraction of the measured span


@dataclass
class WorkerSeries:
    """One worker's samples: seconds since the loader started, USS and PSS in bytes."""

    pid: int
    t: list[float]
    uss: list[int]
    pss: list[int]
    dirty: list[int]  # private dirty pages: what the worker wrote, file pages it maps left out

    def floor(self, values: list[int], start: float, end: float) -> int:
        """The least of ``values`` sampled in ``[start, end]``: memory between transient peaks."""
        inside = [v for t, v in zip(self.t, values, strict=True) if start <= t <= end]
        return min(inside) if inside else values[-1]


def _private_dirty(pid: int) -> int:
    """The private dirty memory of process ``pid`` (``Private_Dirty:`` of ``smaps_rollup``), in
    bytes: the pages it wrote (its heap, and a parent's pages copied on write), without the
    page-cache pages of files it maps read-only (those count in USS when one process alone maps
    them, yet they are the kernel's cache, clean, shared and reclaimable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Private_Dirty:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class WorkerSampler:
    """Samples USS and PSS of each child of this process every ``interval`` s, in a thread."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.series: dict[int, WorkerSeries] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-memory", daemon=True)
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.interval):
            for child in me.children():
                try:
                    info = child.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                s = self.series.setdefault(child.pid, WorkerSeries(child.pid, [], [], [], []))
                s.t.append(self.now())
                s.uss.append(int(info.uss))
                s.pss.append(int(info.pss))
                s.dirty.append(_private_dirty(child.pid))

    def __enter__(self) -> WorkerSampler:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _dataset(kind: Kind, data: Path, folk_index: Path, workers: int) -> Any:
    if kind == "folk":
        from .baselines import FolkJsonDataset

        return FolkJsonDataset(folk_index)
    from pickleshard import PickleDataset, open_index

    # One decoded file per worker, like the folk dataset's "last file": compare indexes, not caches.
    index, _ = open_index(data)
    largest = max(f.decoded_nbytes for f in index.files)
    return PickleDataset(data, cache_bytes=largest * max(1, workers))


def measure_epoch(
    kind: Kind,
    data: Path,
    folk_index: Path,
    *,
    workers: int,
    batch_size: int,
    interval: float,
) -> dict[str, Any]:
    """One sequential epoch of ``kind`` through a DataLoader; per-worker memory series."""
    from torch.utils.data import DataLoader

    ds = _dataset(kind, data, folk_index, workers)
    loader = DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=workers)
    samples = 0
    warm = last_batch = 0.0
    with WorkerSampler(interval) as sampler:
        for xb, _ in loader:
            samples += int(xb.shape[0])
            last_batch = sampler.now()
            if not warm and samples >= WARMUP * len(ds):
                warm = last_batch
    span = last_batch - warm
    early = (warm, warm + WINDOW * span)
    late = (last_batch - WINDOW * span, last_batch)
    workers_out = []
    for s in sampler.series.values():
        workers_out.append(
            {
                **asdict(s),
                "start_uss": s.floor(s.uss, *early),
                "end_uss": s.floor(s.uss, *late),
                "start_pss": s.floor(s.pss, *early),
                "end_pss": s.floor(s.pss, *late),
                "peak_uss": max(s.uss),
                "start_dirty": s.floor(s.dirty, *early),
                "end_dirty": s.floor(s.dirty, *late),
            }
        )
    return {
        "kind": kind,
        "samples": samples,
        "seconds": last_batch,
        "warm": warm,
        "workers": workers_out,
    }


def _ensure_data(root: Path, samples: int, files: int, dim: int) -> tuple[Path, Path]:
    from .baselines import write_folk_index
    from .data import DataSpec, ensure_data

    spec = DataSpec(root, files=files, per_file=samples // files, shape=(dim,))
    written = ensure_data(spec)
    if written or not spec.folk_index.exists():
        write_folk_index(spec.paths, spec.folk_index)
    return spec.directory, spec.folk_index


def _plot(results: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colors = {"folk": "#dd8452", "pickleshard": "#55a868"}
    fig, (uss_ax, pss_ax) = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    for res in results:
        for w, s in enumerate(sorted(res["workers"], key=lambda s: s["pid"])):
            label = f"{res['kind']} worker {w}"
            style = "-" if w == 0 else "--"
            uss_ax.plot(
                s["t"], [v / MiB for v in s["uss"]], style, color=colors[res["kind"]], label=label
            )
            pss_ax.plot(
                s["t"], [v / MiB for v in s["pss"]], style, color=colors[res["kind"]], label=label
            )
    for ax, name in ((uss_ax, "USS (private)"), (pss_ax, "PSS (shared pages divided)")):
        ax.set_xlabel("seconds since the DataLoader started")
        ax.set_ylabel(f"{name}, MiB")
        ax.grid(alpha=0.3)
    uss_ax.legend()
    n = results[0]["samples"]
    fig.suptitle(f"Per-worker memory over one epoch of {n:,} samples, num_workers=2")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| dataset | worker | USS start → end (MiB) | USS growth | PSS start → end (MiB) | PSS growth | USS peak | epoch s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for w, s in enumerate(sorted(res["workers"], key=lambda s: s["pid"])):
            du, dp = s["end_uss"] - s["start_uss"], s["end_pss"] - s["start_pss"]
            lines.append(
                f"| {res['kind']} | {w} | {s['start_uss'] / MiB:.1f} → {s['end_uss'] / MiB:.1f} "
                f"| {du / MiB:+.1f} | {s['start_pss'] / MiB:.1f} → {s['end_pss'] / MiB:.1f} "
                f"| {dp / MiB:+.1f} | {s['peak_uss'] / MiB:.1f} | {res['seconds']:.1f} |"
            )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m bench.worker_memory", description=__doc__.split("\n")[0]
    )
    p.add_argument("--samples", type=int, default=1_000_000, help="index entries (default 1M)")
    p.add_argument("--files", type=int, default=50)
    p.add_argument("--dim", type=int, default=4, help="float32 values per sample")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--interval", type=float, default=0.1, help="seconds between samples")
    p.add_argument("--data-root", type=Path, default=HERE / "data")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    data, folk_index = _ensure_data(args.data_root, args.samples, args.files, args.dim)
    if args.child:  # one dataset, in this fresh process; JSON to stdout
        res = measure_epoch(
            args.child,
            data,
            folk_index,
            workers=args.workers,
            batch_size=args.batch_size,
            interval=args.interval,
        )
        json.dump(res, sys.stdout)
        return 0
    results = []
    for kind in args.kinds.split(","):
        cmd = [
            sys.executable,
            "-m",
            "bench.worker_memory",
            *(argv or sys.argv[1:]),
            "--child",
            kind,
        ]
        out = subprocess.run(
            cmd, cwd=HERE.parent, check=True, stdout=subprocess.PIPE, env={**os.environ}
        ).stdout
        results.append(json.loads(out))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "worker_memory.json").write_text(json.dumps(results))
    plotted = _plot(results, args.out / "worker_memory.png")
    print(
        f"{results[0]['samples']:,} samples, {args.files} files, batch {args.batch_size}, "
        f"num_workers={args.workers}, sampled every {args.interval} s"
    )
    print(_table(results))
    print(
        f"wrote {args.out / 'worker_memory.json'}"
        + (f" and {args.out / 'worker_memory.png'}" if plotted else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
