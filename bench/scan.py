"""``python -m bench.scan`` (or ``python -m bench scan``): index build, scanner vs unpickling.

For each dataset, every file is scanned with the pure-Python opcode walker (``engine="python"``,
the reference) and with the compiled one (``engine="compiled"``), and unpickled with
``pickle.load``, in one process, all from the page cache (every file is read once first); each
figure is the best of ``--repeat`` passes over all files. ``walk`` columns time the opcode walk
alone (``picklekit.walk.walk_opcodes``), the rest of a scan being layout matching and span tables.

Datasets (``pickleshard synth`` layout, ``pickle.dump((x_list, y_list))`` per file):
(a) float32 ``(3, 32, 32)`` arrays, 12 KB samples; (b) float32 ``(3, 224, 224)`` arrays, 600 KB
samples; (c) small Python-object samples (``--kind objects``: dicts of a token list, a string,
a float). Then the scanner's peak memory on one file of ``--big-gb`` GB of 600 KB arrays and
one of ``--big-small-gb`` GB of 12 KB arrays (the file ``python -m bench span`` reads: the most
samples per GB, so the most per-sample scan tables), measured in a fresh process as PSS
(:mod:`pickleshard.pipelines.memory`) and as peak RSS (VmHWM).

Writes ``bench/results/scan[-quick].md`` and ``.json``. ``--cold`` runs
:mod:`bench.coldscan` instead (files evicted from the page cache, bytes fetched beside time). ``--quick`` is a smoke run. The
issue's targets: scan >= 20x faster than unpickling on array data; peak memory < 100 MB.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pickleshard.io import LocalFile
from pickleshard.picklekit.walk import walk_opcodes
from pickleshard.pipelines.synth import Kind, write_synthetic
from pickleshard.scan import ENGINE, scan_file

from .report import describe_machine, report_head, save_results

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
MB = 1e6


@dataclass(frozen=True)
class DataSet:
    """``files`` files of ``per_file`` samples (``kind``, ``shape``) in ``root / name``."""

    label: str
    kind: Kind
    files: int
    per_file: int
    shape: tuple[int, ...] = (3, 32, 32)

    @property
    def name(self) -> str:
        dims = "x".join(map(str, self.shape)) if self.kind == "arrays" else "objects"
        return f"scan-{self.files}x{self.per_file}-{dims}"

    def paths(self, root: Path) -> list[Path]:
        folder = root / self.name
        expected = [folder / f"part-{f:05d}.pkl" for f in range(self.files)]
        if not all(p.exists() for p in expected):
            print(f"writing {folder}", flush=True)
            write_synthetic(
                folder, files=self.files, per_file=self.per_file, shape=self.shape, kind=self.kind
            )
        return expected


FULL = (
    DataSet("(a) 12 KB arrays, float32 3x32x32", "arrays", 8, 5000),
    DataSet("(b) 600 KB arrays, float32 3x224x224", "arrays", 2, 1000, (3, 224, 224)),
    DataSet("(c) Python objects (dict of list, str, float)", "objects", 8, 5000),
)
QUICK = (
    DataSet("(a) 12 KB arrays, float32 3x32x32", "arrays", 2, 500),
    DataSet("(b) 600 KB arrays, float32 3x224x224", "arrays", 1, 50, (3, 224, 224)),
    DataSet("(c) Python objects (dict of list, str, float)", "objects", 2, 500),
)


@dataclass(frozen=True)
class Row:
    """Best-of-``repeat`` seconds over all files of one dataset, per method."""

    dataset: str
    files: int
    samples: int
    megabytes: float
    load_s: float
    scan_python_s: float
    scan_compiled_s: float
    walk_python_s: float
    walk_compiled_s: float
    touch_s: float
    bytes_read: int


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _load_all(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as fh:  # the baseline reads as a user's loop does
            t = pickle.load(fh)
        del t


def _walk_all(paths: list[Path], engine: str) -> None:
    for p in paths:
        with LocalFile(p) as source:
            walk_opcodes(source.map(), source.size, str(p), engine=engine)


def _touch_all(paths: list[Path], spans: list[np.ndarray]) -> int:
    """Read, through a fresh mapping of each file, the first and last byte of every sample
    field's span: the pages any scan that reads each sample's opcodes must fault in."""
    total = 0
    for p, at in zip(paths, spans, strict=True):
        source = LocalFile(p)
        try:
            view = np.frombuffer(source.map(), np.uint8)
            total += int(view[at].sum())
            del view
        finally:
            source.close()
    return total


def _measure(ds: DataSet, root: Path, repeat: int) -> Row:
    paths = ds.paths(root)
    for p in paths:  # into the page cache
        p.read_bytes()
    scans = [scan_file(p, engine="compiled") for p in paths]
    spans = [np.unique(np.concatenate([s.starts.ravel(), s.ends.ravel() - 1])) for s in scans]
    row = Row(
        dataset=ds.label,
        files=ds.files,
        samples=sum(s.num_samples for s in scans),
        megabytes=sum(p.stat().st_size for p in paths) / MB,
        load_s=best_of(lambda: _load_all(paths), repeat),
        scan_python_s=best_of(lambda: [scan_file(p, engine="python") for p in paths], repeat),
        scan_compiled_s=best_of(lambda: [scan_file(p, engine="compiled") for p in paths], repeat),
        walk_python_s=best_of(lambda: _walk_all(paths, "python"), repeat),
        walk_compiled_s=best_of(lambda: _walk_all(paths, "compiled"), repeat),
        touch_s=best_of(lambda: _touch_all(paths, spans), repeat),
        bytes_read=sum(s.bytes_read for s in scans),
    )
    print(
        f"   load {row.load_s:.3f} s, scan python {row.scan_python_s:.3f} s, "
        f"compiled {row.scan_compiled_s:.3f} s",
        flush=True,
    )
    return row


_PEAK_CHILD = """
import json, sys
from pickleshard.pipelines.memory import PeakPSS
from pickleshard.scan import scan_file
def hwm():  # peak RSS of this process so far (VmHWM), in bytes
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
before = hwm()
with PeakPSS(interval=0.005) as peak:
    scan = scan_file(sys.argv[1], engine=sys.argv[2])
print(json.dumps({"samples": scan.num_samples, "pss_start": peak.start_bytes,
    "pss_peak": peak.peak_bytes, "hwm_before": before, "hwm_after": hwm(),
    "bytes_read": scan.bytes_read}))
"""


def _peak_memory(
    root: Path, gb: float, engine: str, shape: tuple[int, ...] = (3, 224, 224)
) -> dict[str, Any]:
    per_file = int(gb * 1e9 / (int(np.prod(shape)) * 4)) + 1
    path = DataSet("big", "arrays", 1, per_file, shape).paths(root)[0]
    path.read_bytes()  # the page cache holds it: the worst case for mapped pages counted in PSS
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, str(path), engine],
        capture_output=True,
        text=True,
        check=True,
    )
    got: dict[str, Any] = json.loads(out.stdout)
    got.update(engine=engine, file=str(path), file_bytes=path.stat().st_size)
    return got


def _ratio(a: float, b: float) -> str:
    return f"{a / b:,.1f}x" if b > 0 else "—"


def _table(rows: list[Row]) -> list[str]:
    head = ["dataset", "files", "samples", "MB", "pickle.load s", "scan python s"]
    head += ["scan compiled s", "load / compiled", "load / python", "python / compiled"]
    head += ["walk python s", "walk compiled s", "page touch s", "load / page touch"]
    head += ["bytes read by scan"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [r.dataset, str(r.files), f"{r.samples:,}", f"{r.megabytes:,.0f}"]
        cells += [f"{r.load_s:.3f}", f"{r.scan_python_s:.3f}", f"{r.scan_compiled_s:.4f}"]
        cells += [_ratio(r.load_s, r.scan_compiled_s), _ratio(r.load_s, r.scan_python_s)]
        cells += [_ratio(r.scan_python_s, r.scan_compiled_s)]
        cells += [f"{r.walk_python_s:.3f}", f"{r.walk_compiled_s:.4f}"]
        cells += [f"{r.touch_s:.4f}", _ratio(r.load_s, r.touch_s)]
        cells += [f"{r.bytes_read / MB:,.1f} MB ({100 * r.bytes_read / (r.megabytes * MB):.2f}%)"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _memory_lines(mem: list[dict[str, Any]]) -> list[str]:
    lines = ["| engine | file | samples | sample KB | PSS at start MB | peak PSS MB | PSS growth MB | peak RSS MB | peak RSS growth MB |"]  # fmt: skip
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for m in mem:
        cells = [m["engine"], f"{m['file_bytes'] / 1e9:.2f} GB", f"{m['samples']:,}"]
        cells += [f"{m['file_bytes'] / max(m['samples'], 1) / 1e3:,.0f}"]
        cells += [f"{m['pss_start'] / MB:,.0f}", f"{m['pss_peak'] / MB:,.0f}"]
        cells += [f"{(m['pss_peak'] - m['pss_start']) / MB:,.1f}"]
        cells += [f"{m['hwm_after'] / MB:,.0f}", f"{(m['hwm_after'] - m['hwm_before']) / MB:,.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m bench.scan", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    parser.add_argument("--repeat", type=int, default=3, help="passes per method; best kept")
    parser.add_argument("--big-gb", type=float, default=2.1, help="peak-memory file, 600 KB arrays")
    parser.add_argument(
        "--big-small-gb", type=float, default=3.0, help="peak-memory file, 12 KB arrays"
    )
    parser.add_argument("--data", type=Path, default=HERE / "data", help="where datasets live")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--cold", action="store_true", help="cold page cache, bytes fetched (bench.coldscan)"
    )
    given = sys.argv[1:] if argv is None else argv
    if "--cold" in given:
        from .coldscan import main as cold_main

        return cold_main([a for a in given if a != "--cold"])
    args = parser.parse_args(argv)
    if ENGINE != "compiled":
        print("the compiled scanner is not built: pip install -e . first", file=sys.stderr)
        return 2
    command = shlex.join(["python", "-m", "bench.scan", *(sys.argv[1:] if argv is None else argv)])
    machine = describe_machine(command)
    rows = []
    for ds in QUICK if args.quick else FULL:
        print(f"-- {ds.label}", flush=True)
        rows.append(_measure(ds, args.data, args.repeat))
    big_gb = 0.05 if args.quick else args.big_gb
    small_gb = 0.05 if args.quick else args.big_small_gb
    mem = [_peak_memory(args.data, big_gb, e) for e in ("compiled", "python")]
    mem += [_peak_memory(args.data, small_gb, e, (3, 32, 32)) for e in ("compiled", "python")]
    name = "scan-quick" if args.quick else "scan"
    lines = report_head("Index build: the opcode scanner vs unpickling", machine)
    lines += ["", "## Setup", "", *_SETUP.strip().splitlines()]
    lines += ["", "## Scan time", "", *_table(rows), "", "## Scanner peak memory", ""]
    lines += [*_memory_lines(mem), ""]
    raw = {"machine": machine, "rows": [asdict(r) for r in rows], "memory": mem}
    save_results(args.out, name, lines, raw)
    return 0


_SETUP = """
- every figure is the best of --repeat passes over all files of the dataset, in one process,
  files in the page cache; `pickle.load` is the time to unpickle each file (its result freed
  outside the timer)
- scan = `scan_file(path, engine=...)`: the opcode walk, layout matching, span and memo tables
  (what an index build does per file); walk = `picklekit.walk.walk_opcodes` alone
- page touch = reading, through a fresh mmap of each file, the first and last byte of every
  sample's span (numpy fancy index, offsets computed outside the timer): the page faults any
  scanner that reads each sample's opcodes must take, with no work at all on the bytes.
  `load / page touch` is therefore the most any such scanner can be faster than `pickle.load`
- peak memory: `scan_file` of one file in a fresh process (after importing numpy and pickleshard),
  the file in the page cache; PSS sampled every 5 ms (`pickleshard.pipelines.memory.PeakPSS`) counts the
  file's pages mapped through the scan's mmap (the walk unmaps them every 4 MiB) plus private
  memory; peak RSS is the process's VmHWM, its growth the part the scan added
"""


if __name__ == "__main__":
    sys.exit(main())
