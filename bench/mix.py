"""``python -m bench mix``: a mix of two PickleDatasets against one PickleDataset of the same samples.

The data: two folders of ``pickle.dump((x_list, y_list))`` files (float32 3x32x32 arrays,
``write_synthetic`` with two seeds), and a third folder of hard links to all of their files, so
the single dataset reads the very same bytes from the same page cache. The rows:

- **one**: ``PickleDataset(all)`` with ``ShuffleSampler``;
- **mix**: ``MixedDataset([PickleDataset(a), PickleDataset(b)])``, default weights (in proportion
  to the sizes, epoch size their total: one pass over each) with ``MixSampler`` (the mix's own
  shuffled order, resolved in the main process in chunks).

Both go through the same loop, ``DataLoader(ds, batch_size=64, sampler=..., num_workers=W,
persistent_workers=W > 0)``, each batch consumed as ``float(xb.sum())``. For each ``W``, both
loaders are made and run one untimed warm-up epoch (index opened, page cache warm, workers
started, so their start-up, which varies by tenths of a second, is in neither row); then
``--rounds`` (5) shuffled epochs of each, interleaved (one, mix; mix, one; ...) so that the
machine's other load falls on both, the shortest epoch of each kept. The ratio is mix samples/s
over one samples/s. Target (issue 29): >= 0.95x.

Writes ``bench/results/mix[-quick].md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from pickleshard import MixedDataset, MixSampler, PickleDataset, ShuffleSampler
from pickleshard.pipelines.synth import write_synthetic

from .report import describe_machine, report_head, save_results

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
BATCH = 64
TARGET = 0.95


def _ensure(root: Path, files: int, per_file: int, shape: tuple[int, ...]) -> list[Path]:
    """The two source folders and the folder of links to both; written once, then reused."""
    dims = "x".join(str(d) for d in shape)
    base = root / f"mix-{files}x{per_file}-f32-{dims}"
    folders = [base / "a", base / "b", base / "all"]
    if not (base / "done").exists():
        for seed, folder in enumerate(folders[:2]):
            write_synthetic(folder, files=files, per_file=per_file, shape=shape, seed=seed)
        folders[2].mkdir(parents=True, exist_ok=True)
        for name, folder in zip("ab", folders[:2], strict=True):
            for path in sorted(folder.glob("*.pkl")):
                link = folders[2] / f"{name}-{path.name}"
                if not link.exists():
                    os.link(path, link)
        (base / "done").write_text("")
    return folders


def _epoch(loader: DataLoader[Any], sampler: Any, *, epoch: int) -> tuple[int, float]:
    sampler.set_epoch(epoch)
    t0 = time.perf_counter()
    count, total = 0, 0.0
    for xb, _ in loader:
        total += float(xb.sum())
        count += len(xb)
    return count, time.perf_counter() - t0


def _setup(kind: str, folders: list[Path], workers: int) -> tuple[DataLoader[Any], Any]:
    if kind == "one":
        ds: Any = PickleDataset(folders[2])
        sampler: Any = ShuffleSampler(ds, seed=1)
    else:
        ds = MixedDataset([PickleDataset(folders[0]), PickleDataset(folders[1])], seed=1)
        sampler = MixSampler(ds, seed=1)
    loader = DataLoader(
        ds, batch_size=BATCH, sampler=sampler, num_workers=workers, persistent_workers=workers > 0
    )
    _epoch(loader, sampler, epoch=0)  # warm-up: page cache, readers, the workers started
    return loader, sampler


def _pair(folders: list[Path], workers: int, rounds: int) -> list[dict[str, Any]]:
    """The two rows for ``workers``: epochs interleaved, one then mix, mix then one, ...;
    the best (shortest) epoch of each row kept."""
    setups = {kind: _setup(kind, folders, workers) for kind in ("one", "mix")}
    best: dict[str, tuple[int, float]] = {}
    for r in range(rounds):
        for kind in ("one", "mix") if r % 2 == 0 else ("mix", "one"):
            samples, seconds = _epoch(*setups[kind], epoch=r + 1)
            print(f"   {kind} W={workers}: {samples:,} samples in {seconds:.3f} s", flush=True)
            if kind not in best or seconds < best[kind][1]:
                best[kind] = (samples, seconds)
    return [
        {"kind": k, "workers": workers, "samples": best[k][0], "seconds": best[k][1]}
        for k in ("one", "mix")
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench mix", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    parser.add_argument("--files", type=int, default=4, help="files per source")
    parser.add_argument("--per-file", type=int, default=5000)
    parser.add_argument("--workers", default="0,2", help="DataLoader num_workers, e.g. 0,2")
    parser.add_argument("--rounds", type=int, default=5, help="timed epochs per row; best kept")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    parser.add_argument("--data", type=Path, default=HERE / "data", help="where datasets live")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.per_file = 2, 200
    command = shlex.join(
        ["python", "-m", "bench", "mix", *(sys.argv[1:] if argv is None else argv)]
    )
    machine = describe_machine(command)
    folders = _ensure(args.data, args.files, args.per_file, (3, 32, 32))
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        rows += _pair(folders, workers, args.rounds)
    machine["load average at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    n = 2 * args.files * args.per_file
    lines = report_head("A mix of two PickleDatasets vs one PickleDataset", machine)
    lines += ["", "## Setup", "", *(__doc__ or "").strip().splitlines()[2:-2]]
    lines += ["", f"{n:,} samples of float32 3x32x32 in {2 * args.files} files.", ""]
    lines += ["## Shuffled epoch", "", "| W | one samples/s | mix samples/s | mix / one |"]
    lines += ["|---|---|---|---|"]
    ratios = {}
    for one, mix in zip(rows[::2], rows[1::2], strict=True):
        r1, r2 = one["samples"] / one["seconds"], mix["samples"] / mix["seconds"]
        ratios[one["workers"]] = r2 / r1
        lines.append(f"| {one['workers']} | {r1:,.0f} | {r2:,.0f} | {r2 / r1:.3f}x |")
    worst = min(ratios.values())
    verdict = "met" if worst >= TARGET else "not met"
    lines += ["", f"Target mix / one >= {TARGET}x: {verdict} (lowest {worst:.3f}x).", ""]
    name = "mix-quick" if args.quick else "mix"
    save_results(args.out, name, lines, {"machine": machine, "rows": rows, "ratios": ratios})
    return 0


if __name__ == "__main__":
    sys.exit(main())
