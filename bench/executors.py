"""``python -m bench executors``: index, convert and verify through the local executor and Dask.

One synthetic dataset (``bench.data``: float32 arrays and int labels, one
``pickle.dump((x_list, y_list))`` per file); each operation runs through the local process pool
(``jobs`` processes) and through a Dask ``LocalCluster`` of ``jobs`` worker processes (one
thread each, 127.0.0.1) started once for the whole run, alternating local and Dask
``--repeat`` times; the table gives the best time of each and their ratio. The cluster's start
and its workers' first task (importing pickleshard, numpy and torch) are timed on their own
rows: a run with ``--executor dask`` and no address pays them once per command. Every Dask
output is compared byte for byte with the local one (the index with its random file-name
token aside).

Writes ``bench/results/executors-dask[-quick].md`` and ``.json``. ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pickleshard.executors.dask import DaskExecutor
from pickleshard.indexing.build import build_index
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.verify.run import verify

from .data import DataSpec, ensure_data
from .report import describe_machine, report_head, save_results

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
SIZES = {"quick": (4, 100), "full": (16, 1000)}


def _tree(root: Path) -> dict[str, bytes]:
    token = b""
    if (root / "index.json").is_file():
        found = re.search(rb'"samples-([0-9a-f]+)\.npy"', (root / "index.json").read_bytes())
        token = found.group(1) if found else b""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            name = os.fspath(p.relative_to(root))
            if token:
                data = data.replace(token, b"T")
                name = name.replace(token.decode(), "T")
                data = re.sub(rb'"bytes_fetched": \d+', b'"bytes_fetched": 0', data)
            out[name] = data
    return out


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    files, per_file = SIZES["quick" if args.quick else "full"]
    spec = DataSpec(args.data, files, per_file, (3, 32, 32))
    ensure_data(spec)
    data = spec.directory
    nbytes = sum(p.stat().st_size for p in data.glob("*.pkl"))
    build_index(data, jobs=args.jobs)  # the source's own index, for convert and verify
    ex = DaskExecutor(workers=args.jobs)
    rows: dict[str, dict[str, list[float]]] = {}
    with ex:
        t0 = time.perf_counter()
        list(ex.run(os.getpid, [()]))
        start = time.perf_counter() - t0
        warm = _timed(lambda: list(ex.run(_import_everything, [()] * args.jobs)))

        def index(executor: Any, tag: str, r: int) -> Callable[[], Any]:
            return lambda: build_index(
                data, index=work / f"index-{tag}-{r}", jobs=args.jobs, executor=executor
            )

        def conv(executor: Any, tag: str, r: int) -> Callable[[], Any]:
            return lambda: convert(
                data, work / f"memmap-{tag}-{r}", jobs=args.jobs, executor=executor
            )

        def check(executor: Any, tag: str, r: int) -> Callable[[], Any]:
            return lambda: verify(data, work / f"memmap-{tag}-0", jobs=args.jobs, executor=executor)

        for name, make in (("index", index), ("convert to memmap", conv), ("verify", check)):
            rows[name] = {"local": [], "dask": []}
            for r in range(args.repeat):
                rows[name]["local"].append(_timed(make(None, "local", r)))
                rows[name]["dask"].append(_timed(make(ex, "dask", r)))
    identical = {
        "index": _tree(work / "index-dask-0") == _tree(work / "index-local-0"),
        "memmap": _tree(work / "memmap-dask-0") == _tree(work / "memmap-local-0"),
    }
    return {
        "dataset": spec.name,
        "files": files,
        "samples": files * per_file,
        "bytes": nbytes,
        "jobs": args.jobs,
        "repeat": args.repeat,
        "cluster_start_s": start,
        "worker_warmup_s": warm,
        "rows": rows,
        "identical": identical,
    }


def _import_everything() -> int:

    return os.getpid()


def _report(raw: dict[str, Any], machine: dict[str, str]) -> list[str]:
    lines = report_head(f"Local executor vs Dask LocalCluster ({raw['dataset']})", machine)
    lines += [
        "",
        "## Setup",
        "",
        f"- {raw['samples']} samples in {raw['files']} files, {raw['bytes'] / 1e6:.0f} MB of "
        f"pickles, in the page cache; jobs={raw['jobs']} (local pool processes = Dask workers, "
        "one thread each); best of "
        f"{raw['repeat']}, local and Dask alternating",
        "- the machine has 2 cores, shared with other jobs during the run (see the load "
        "average): the ratios are indicative, not a measurement of Dask's overhead alone",
        f"- outputs identical byte for byte: index {raw['identical']['index']}, memmap "
        f"{raw['identical']['memmap']}",
        "",
        "## Results",
        "",
        "| operation | local s | dask s | dask / local |",
        "|---|---:|---:|---:|",
        f"| start a LocalCluster (once per command without an address) |  | "
        f"{raw['cluster_start_s']:.2f} |  |",
        f"| first tasks (the workers import pickleshard, torch) |  | "
        f"{raw['worker_warmup_s']:.2f} |  |",
    ]
    for name, row in raw["rows"].items():
        lo, da = min(row["local"]), min(row["dask"])
        lines.append(f"| {name} | {lo:.2f} | {da:.2f} | {da / lo:.2f}x |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench executors", description=__doc__, allow_abbrev=False
    )
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--data", type=Path, default=HERE / "data")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--name", default="executors-dask")
    args = p.parse_args(argv)
    command = shlex.join(["python", "-m", "bench", "executors", *(argv or [])])
    machine = describe_machine(command)
    work = args.data / "executors-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        raw = _measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    name = args.name + ("-quick" if args.quick else "")
    save_results(args.out, name, _report(raw, machine), {"machine": machine, **raw})
    return 0


if __name__ == "__main__":
    sys.exit(main())
