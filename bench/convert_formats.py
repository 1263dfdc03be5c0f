"""``python -m bench convert-formats``: Lance and ArrayRecord conversions against Parquet (issue 30).

The data: ``write_synthetic`` files of float32 3x32x32 arrays and int labels, indexed once before
any row (no row pays for the index). The rows, one run:

- **convert**: ``pickleshard.pipelines.convert.run.convert(src, out, to=F, jobs=J)`` for F in
  parquet, lance, arrayrecord (and memmap, the read rows' reference), each in a child process
  whose tree's PSS (psutil, every 20 ms) gives the peak memory; ``--rounds`` conversions of
  each, interleaved (parquet, lance, arrayrecord, parquet, ...), the fastest kept (its peak is
  the largest over the rounds). The child imports the format's library before its clock starts;
  "peak above imports" subtracts its PSS at that point (lance's library alone maps ~80 MiB). Targets: time <= Parquet's / 0.8, peak <= Parquet's.
- **read**: one shuffled epoch of each output through ``open_dataset`` in the same
  ``DataLoader(batch_size=64, shuffle=True, num_workers=0)`` loop, best of ``--rounds``.

Writes ``bench/results/convert-lance-arrayrecord[-quick].md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from pickleshard import PickleDataset
from pickleshard.formats import open_dataset
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.synth import write_synthetic

from .measure import MiB, tree_memory
from .report import describe_machine, report_head, save_results

__all__ = ["main"]

FORMATS = ("parquet", "lance", "arrayrecord", "memmap")


_BACKENDS = {
    "parquet": "pyarrow.parquet",
    "lance": "lance",
    "arrayrecord": "array_record.python.array_record_module",
    "memmap": "numpy",
}


def _child(fmt: str, src: str, out: str, jobs: int) -> None:
    # The backend is imported before the clock and the baseline: its load time is not the
    # conversion's, and its code pages (lance's library maps ~80 MiB) are not data memory.
    importlib.import_module(_BACKENDS[fmt])
    base = tree_memory().pss
    t0 = time.perf_counter()
    convert(src, out, to=fmt, jobs=jobs)
    print(json.dumps({"seconds": time.perf_counter() - t0, "base": base}))


def _convert_row(fmt: str, src: Path, out: Path, jobs: int) -> tuple[float, int, int]:
    """Seconds (inside the child), the child tree's peak PSS of one conversion, and that peak
    above the child's PSS once its backend was imported."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "bench.convert_formats", "--child", fmt, str(src), str(out)]
    proc = subprocess.Popen([*cmd, str(jobs)], stdout=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_memory(proc.pid).pss)
        time.sleep(0.02)
    stdout = proc.stdout.read() if proc.stdout is not None else ""
    if proc.returncode:
        raise RuntimeError(f"converting to {fmt} failed ({proc.returncode})")
    got = json.loads(stdout.strip().splitlines()[-1])
    return float(got["seconds"]), peak, peak - int(got["base"])


def _epoch(ds: Any) -> float:
    loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=0)
    t0 = time.perf_counter()
    n = 0
    for xb, _ in loader:
        float(xb.sum())
        n += len(xb)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["--child"]:
        _child(given[1], given[2], given[3], int(given[4]))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench convert-formats")
    parser.add_argument("--work", type=Path, default=Path("bench/data/convert-formats"))
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--per-file", type=int, default=2500)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="8 x 500 samples, one round")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(given)
    if args.quick:
        args.per_file, args.rounds = 500, 1
    src = args.work / f"src-{args.files}x{args.per_file}"
    if not src.exists():
        write_synthetic(src, files=args.files, per_file=args.per_file)
    n = len(PickleDataset(src))  # indexed here, before any row
    seconds: dict[str, float] = {}
    peaks: dict[str, int] = {}
    above: dict[str, int] = {}
    for _ in range(args.rounds):
        for fmt in FORMATS:
            s, peak, extra = _convert_row(fmt, src, args.work / fmt, args.jobs)
            seconds[fmt] = min(seconds.get(fmt, s), s)
            peaks[fmt] = max(peaks.get(fmt, 0), peak)
            above[fmt] = max(above.get(fmt, 0), extra)
    reads: dict[str, float] = {}
    datasets = {fmt: open_dataset(args.work / fmt) for fmt in FORMATS}
    for _ in range(args.rounds):
        for fmt, ds in datasets.items():
            reads[fmt] = max(reads.get(fmt, 0.0), _epoch(ds))
    command = shlex.join(["python", "-m", "bench", "convert-formats", *given])
    lines = [
        *report_head("Lance and ArrayRecord conversions against Parquet (issue 30)", describe_machine(command)),
        "",
        f"{n} samples (float32 3x32x32 + int label) in {args.files} files; jobs={args.jobs}; "
        f"best of {args.rounds} (peak: largest). Targets: convert >= 0.8x Parquet's speed, "
        "peak PSS <= Parquet's.",
        "",
        "| format | convert s | speed vs Parquet | peak PSS MiB | peak vs Parquet | peak above imports MiB | vs Parquet | shuffled epoch samples/s | read vs memmap |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for fmt in FORMATS:
        lines.append(
            f"| {fmt} | {seconds[fmt]:.2f} | {seconds['parquet'] / seconds[fmt]:.2f}x | "
            f"{peaks[fmt] / MiB:.0f} | {peaks[fmt] / peaks['parquet']:.2f}x | "
            f"{above[fmt] / MiB:.0f} | {above[fmt] / above['parquet']:.2f}x | "
            f"{reads[fmt]:,.0f} | {reads[fmt] / reads['memmap']:.2f}x |"
        )
    raw = {
        "samples": n,
        "seconds": seconds,
        "peak_pss": peaks,
        "peak_pss_above_imports": above,
        "read_samples_per_s": reads,
    }
    name = "convert-lance-arrayrecord" + ("-quick" if args.quick else "")
    save_results(args.out, name, [*lines, ""], raw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
