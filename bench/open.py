"""``python -m bench open``: a dataset's first open (index build + audit) against ``pickle.load``.

For each dataset (8 files each, written once under ``--data``): ``pickle.load`` of every file,
then the first ``PickleDataset(folder)`` (the index removed before each try), warm (files in the
page cache) and cold (every data file evicted with ``posix_fadvise(POSIX_FADV_DONTNEED)`` before
the try; bytes fetched from storage are ``read_bytes`` of ``/proc/self/io``). Best of
``--repeat``. The warm pair is measured twice: in this process (later tries find the heap, the scratch
buffers and the lazily made parts the first try made) and *fresh*, each try in a new process of
its own (imports done before the clock starts), alternating the two sides: what a user running
either once sees. The first open's phases (scan, sizing, audit, write) are timed inside the warm
open itself, by wrapping the functions that do them. Writes ``first-open.md``/``.json`` under
``--out``; never asserts a speed.

``--executors``: the index build of 2, 8 and 32 files (copies of the 12 KB array and object
files) in this process, in 2 threads and in 2 processes, best of ``--repeat`` (the crossover
:mod:`pickleshard.executors.local` states); writes ``index-executors.md``/``.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from pickleshard import PickleDataset, build_index
from pickleshard.executors import IndexExecutor, InlineExecutor, ProcessPoolIndexExecutor
from pickleshard.index import DatasetIndex
from pickleshard.indexing import build as build_mod
from pickleshard.indexing import describe as describe_mod

from .report import describe_machine, report_head, save_results

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
KINDS = {
    "arrays-12KB": "8 x 2,500 float32 (3,32,32) arrays + int labels",
    # pickle.dump's default protocol (Python 3.8-3.13): numpy arrays pickle another way
    "arrays-12KB-p4": "the same, protocol 4 (pickle.dump's default)",
    "objects": "8 x 12,500 dicts (16-token list, str, float)",
    "arrays-150KB": "8 x 1,000 float32 (3,112,112) arrays + int labels",
}
PHASES = {
    "scan": (describe_mod, "scan_file"),
    "sizing": (describe_mod, "_estimate"),
    "audit": (describe_mod, "_globals"),
    "write": (build_mod, "write_index"),
}


def _write(folder: Path, kind: str, per_file: int) -> None:
    if folder.is_dir() and len(list(folder.glob("*.pkl"))) == 8:
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for f in range(8):
        obj: Any
        if kind == "objects":
            obj = [
                {"tokens": rng.integers(0, 30000, 16).tolist(), "text": f"s{i}", "score": i / 3}
                for i in range(per_file)
            ]
        else:
            shape = (3, 112, 112) if kind == "arrays-150KB" else (3, 32, 32)
            obj = (
                [rng.random(shape, dtype=np.float32) for _ in range(per_file)],
                list(range(per_file)),
            )
        with open(folder / f"part{f}.pkl", "wb") as fh:
            pickle.dump(obj, fh, protocol=4 if kind.endswith("-p4") else 5)
            fh.flush()
            os.fsync(fh.fileno())


def _evict(folder: Path) -> None:
    for p in folder.glob("*.pkl"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_bytes() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("read_bytes"))


def _load_all(folder: Path) -> None:
    for p in sorted(folder.glob("*.pkl")):
        with open(p, "rb") as fh:
            pickle.load(fh)


def _no_index(folder: Path) -> None:
    """Before each try of a first open, outside its timing: the index removed."""
    shutil.rmtree(folder / ".pickleshard", ignore_errors=True)


def _first_open(folder: Path) -> None:
    PickleDataset(folder)


def _touch_floor(folder: Path) -> tuple[float, int]:
    """Cold (files evicted): one 4 KiB ``pread`` of the page holding each sample's first byte,
    every field, the file advised random: the reads any scan that finds the sample boundaries
    makes at least (the disk's random-read floor for this data). Seconds and bytes fetched."""
    index = DatasetIndex.open(folder / ".pickleshard")
    _evict(folder)
    before, t = _read_bytes(), time.perf_counter()
    for pos, entry in enumerate(index.files):
        path = folder / entry.path
        pages = np.unique(np.asarray(index.scan(pos, path).starts).ravel() // 4096)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for page in pages.tolist():
                os.pread(fd, 4096, page * 4096)
        finally:
            os.close(fd)
    return time.perf_counter() - t, _read_bytes() - before


@contextmanager
def _timed_phases() -> Iterator[dict[str, float]]:
    spent = dict.fromkeys(PHASES, 0.0)
    saved = {}
    for name, (mod, attr) in PHASES.items():
        fn = getattr(mod, attr)
        saved[name] = fn

        def wrapped(*a: Any, _fn: Callable[..., Any] = fn, _n: str = name, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                spent[_n] += time.perf_counter() - t

        setattr(mod, attr, wrapped)
    try:
        yield spent
    finally:
        for name, (mod, attr) in PHASES.items():
            setattr(mod, attr, saved[name])


def _cpu() -> float:
    """CPU seconds this process has used (user + system): less moved than wall time by the
    other processes of a shared machine."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _best(
    fn: Callable[[], Any],
    repeat: int,
    cold: Path | None = None,
    setup: Callable[[], Any] | None = None,
) -> tuple[float, int]:
    return _best_cpu(fn, repeat, cold, setup)[:2]


def _best_cpu(
    fn: Callable[[], Any],
    repeat: int,
    cold: Path | None = None,
    setup: Callable[[], Any] | None = None,
) -> tuple[float, int, float]:
    """Best wall seconds of ``repeat`` tries, the bytes fetched in that try, and the best CPU
    seconds of any try; ``setup`` runs before each try, outside its timing."""
    best, fetched, cpu = float("inf"), 0, float("inf")
    for _ in range(repeat):
        if setup is not None:
            setup()
        if cold is not None:
            _evict(cold)
        # each try starts as a new process would: the last try's dataset (a reference cycle
        # holding maps of the index files its successor's rmtree deleted) is not freed inside
        # this one's timing (its collection measured 3 ms, the kernel dropping those files)
        gc.collect()
        before = _read_bytes()
        c, t = _cpu(), time.perf_counter()
        fn()
        took, used = time.perf_counter() - t, _cpu() - c
        cpu = min(cpu, used)
        if took < best:
            best, fetched = took, _read_bytes() - before
    return best, fetched, cpu


def _fresh_try(side: str, folder: Path) -> tuple[float, float]:
    """One try of ``side`` (``load`` or ``open``) in a new process: its wall and CPU seconds."""
    cmd = [sys.executable, "-m", "bench", "open", "--child", side, "--data", str(folder)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return float(got["wall"]), float(got["cpu"])


def _fresh_best(folder: Path, repeat: int) -> dict[str, tuple[float, float]]:
    """Best wall and best CPU seconds of ``repeat`` fresh tries of each side, alternating."""
    best = {side: (float("inf"), float("inf")) for side in ("load", "open")}
    for _ in range(repeat):
        for side in best:
            wall, cpu = _fresh_try(side, folder)
            best[side] = (min(best[side][0], wall), min(best[side][1], cpu))
    return best


def _child(side: str, folder: Path) -> int:
    """The body of one fresh try (see :func:`_fresh_try`): prints its seconds as JSON."""
    if side == "open":
        _no_index(folder)
    gc.collect()
    c, t = _cpu(), time.perf_counter()
    (_first_open if side == "open" else _load_all)(folder)
    print(json.dumps({"wall": time.perf_counter() - t, "cpu": _cpu() - c}))
    return 0


class _Threads:
    """An executor of ``n`` threads (not the package's: measured here to show it never pays)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def run(
        self, work: Callable[..., Any], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, Any], None, None]:
        with ThreadPoolExecutor(self.n) as pool:
            futures = {pool.submit(work, *a): k for k, a in enumerate(tasks)}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()


def _executors(data: Path, out: Path, repeat: int, argv: list[str]) -> None:
    runners: dict[str, IndexExecutor] = {
        "inline": InlineExecutor(),
        "2 threads": _Threads(2),
        "2 processes": ProcessPoolIndexExecutor(2),
    }
    rows: dict[str, dict[str, float]] = {}
    for kind, n in (("arrays-12KB", 2500), ("objects", 12500)):
        src = data / f"{kind}-{n}"
        _write(src, kind, n)
        parts = sorted(src.glob("*.pkl"))
        for files in (2, 8, 32):
            folder = data / f"executors-{kind}-{files}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(files):
                if not (folder / f"p{i:03d}.pkl").exists():
                    shutil.copyfile(parts[i % len(parts)], folder / f"p{i:03d}.pkl")
            row = rows.setdefault(f"{kind} x {files} files", {})
            for name, runner in runners.items():

                def build(folder: Path = folder, runner: IndexExecutor = runner) -> None:
                    build_index(folder, executor=runner)

                row[name] = _best(build, repeat, setup=partial(_no_index, folder))[0]
    machine = describe_machine(shlex.join([sys.executable, "-m", "bench", "open", *argv]))
    lines = report_head("Index build: this process vs threads vs processes", machine)
    lines += ["", f"Best of {repeat}, seconds.", "", "| data | " + " | ".join(runners) + " |"]
    lines.append("|---|" + "---:|" * len(runners))
    for what, row in rows.items():
        lines.append(f"| {what} | " + " | ".join(f"{row[k]:.3f}" for k in runners) + " |")
    save_results(out, "index-executors", lines, {"rows": rows, "machine": machine})
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench open", description=__doc__)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--data", type=Path, default=Path("/tmp/pickleshard-bench-open"))
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--quick", action="store_true", help="a smoke run: 200 samples a file")
    p.add_argument("--executors", action="store_true", help="inline vs threads vs processes")
    p.add_argument("--child", choices=("load", "open"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return _child(args.child, args.data)
    if args.executors:
        _executors(args.data, args.out, args.repeat, argv or [])
        return 0
    per_file = {"arrays-12KB": 2500, "arrays-12KB-p4": 2500, "objects": 12500, "arrays-150KB": 1000}
    rows: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        n = 200 if args.quick else per_file[kind]
        folder = args.data / f"{kind}-{n}"
        _write(folder, kind, n)
        size = sum(f.stat().st_size for f in folder.glob("*.pkl"))
        load_w, _, load_cpu = _best_cpu(partial(_load_all, folder), args.repeat)
        fresh = partial(_no_index, folder)
        open_w, _, open_cpu = _best_cpu(partial(_first_open, folder), args.repeat, setup=fresh)
        new = _fresh_best(folder, args.repeat)
        fresh()
        gc.collect()
        with _timed_phases() as spent:
            _first_open(folder)
        load_c, load_bytes = _best(partial(_load_all, folder), args.repeat, folder)
        open_c, open_bytes = _best(partial(_first_open, folder), args.repeat, folder, fresh)
        t = time.perf_counter()
        PickleDataset(folder)
        reopen = time.perf_counter() - t
        floor_s, floor_bytes = min(_touch_floor(folder) for _ in range(args.repeat))
        rows[kind] = {
            "bytes": size,
            "load_warm": load_w,
            "open_warm": open_w,
            "ratio_warm": load_w / open_w,
            "load_warm_cpu": load_cpu,
            "open_warm_cpu": open_cpu,
            "ratio_warm_cpu": load_cpu / open_cpu,
            "load_cold": load_c,
            "open_cold": open_c,
            "ratio_cold": load_c / open_c,
            "load_cold_fetched": load_bytes,
            "open_cold_fetched": open_bytes,
            "reopen": reopen,
            "floor_cold": floor_s,
            "floor_cold_fetched": floor_bytes,
            "phases": dict(spent),
            "load_fresh": new["load"][0],
            "open_fresh": new["open"][0],
            "ratio_fresh": new["load"][0] / new["open"][0],
            "load_fresh_cpu": new["load"][1],
            "open_fresh_cpu": new["open"][1],
            "ratio_fresh_cpu": new["load"][1] / new["open"][1],
        }
    machine = describe_machine(shlex.join([sys.executable, "-m", "bench", "open", *(argv or [])]))
    lines = report_head("First open: index build + audit vs pickle.load of every file", machine)
    lines += [
        "",
        f"Best of {args.repeat}. Ratio: pickle.load time / first-open time (above 1: the open "
        "is faster). Fresh: each try in a new process (both sides, alternating); warm: "
        "every try in this one (later loads reuse the heap the first grew). Cold: data files evicted before each try; fetched: read_bytes. Floor: "
        "cold, one 4 KiB pread of the page holding each sample's first byte (file advised "
        "random), the reads any scan finding the sample boundaries makes at least. CPU: the "
        "best CPU seconds (user + system) of the same warm tries, and their ratio.",
        "",
        "| data | MB | load fresh s | open fresh s | ratio fresh | CPU ratio fresh "
        "| load warm s | first open warm s | ratio | load cold s | open cold s "
        "| ratio | open fetched | floor cold s | open / floor | reopen s "
        "| scan | sizing | audit | write | load CPU s | open CPU s | CPU ratio |",
        "|---|" + "---:|" * 22,
    ]
    for kind, r in rows.items():
        ph = r["phases"]
        frac = r["open_cold_fetched"] / r["bytes"] if r["bytes"] else 0.0
        lines.append(
            f"| {KINDS[kind]} | {r['bytes'] / 1e6:.1f} | {r['load_fresh']:.3f} | "
            f"{r['open_fresh']:.3f} | {r['ratio_fresh']:.2f}x | {r['ratio_fresh_cpu']:.2f}x | "
            f"{r['load_warm']:.3f} | "
            f"{r['open_warm']:.3f} | {r['ratio_warm']:.2f}x | {r['load_cold']:.3f} | "
            f"{r['open_cold']:.3f} | {r['ratio_cold']:.2f}x | {frac:.1%} | "
            f"{r['floor_cold']:.3f} | {r['open_cold'] / r['floor_cold']:.2f}x | {r['reopen']:.3f} | "
            + " | ".join(f"{ph[k]:.3f}" for k in PHASES)
            + f" | {r['load_warm_cpu']:.3f} | {r['open_warm_cpu']:.3f} | "
            f"{r['ratio_warm_cpu']:.2f}x |"
        )
    name = "first-open" + ("-quick" if args.quick else "")
    save_results(args.out, name, lines, {"rows": rows, "machine": machine})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
