"""``python -m bench --suite full|quick``: prepare every loader's copy, run every row, report.

Rows run one at a time, each in a fresh process (``bench.suite.child``), with the page cache set
first: the files a row reads (the pickles, or the loader's converted copy) are evicted with
``POSIX_FADV_DONTNEED`` for a cold dataset and read once for a cached one. Peers that need
libraries pickleshard's environment lacks run under ``--peer-python`` (an interpreter with
``litdata``, ``mosaicml-streaming``, ``datasets``, ``torch`` and ``psutil``); without it they
run here if importable, else their rows say what to install.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .datasets import data_files, ensure_pickles, evict, tree_bytes, warm
from .plan import KINDS, LOADERS, PEERS, DatasetSpec, RowSpec, datasets_for
from .prepare import PREP_KEY

__all__ = ["main"]

HERE = Path(__file__).resolve().parents[1]
MiB = 1 << 20
SUITES: dict[str, dict[str, Any]] = {
    "full": {"cache_bytes": 256 * MiB, "folk_cap": 256, "workers": (0, 2), "timeout": 900},
    "quick": {"cache_bytes": 8 * MiB, "folk_cap": 128, "workers": (0,), "timeout": 120},
}


def _names(allowed: dict[str, Any] | tuple[str, ...], text: str) -> tuple[str, ...]:
    chosen = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in chosen if x not in allowed]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}; got {text!r}")
    return chosen


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench --suite", description=__doc__, allow_abbrev=False
    )
    p.add_argument("--suite", choices=tuple(SUITES), required=True)
    p.add_argument("--quick", action="store_true", help="same as --suite quick (a smoke run)")
    p.add_argument("--kinds", type=lambda t: _names(KINDS, t), default=None)
    p.add_argument("--loaders", type=lambda t: _names(LOADERS, t), default=tuple(LOADERS))
    p.add_argument("--workers", type=lambda t: tuple(int(w) for w in t.split(",")), default=None)
    p.add_argument(
        "--sizes",
        type=lambda t: tuple(t.split(",")),
        default=None,
        help="of each kind's datasets only these sizes (cached, cold), e.g. --sizes cached",
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--peer-python", type=Path, default=None, help="interpreter for peer rows")
    p.add_argument("--data", type=Path, default=HERE / "data" / "suite")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--name", default=None, help="results file stem (default suite-SUITE)")
    p.add_argument("--render", type=Path, default=None, help="re-render a results JSON, no runs")
    p.add_argument(
        "--resume", action="store_true", help="keep the rows of a run cut short (NAME.partial.json)"
    )
    return p


def _child(python: str, step: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="suite-") as tmp:
        out = Path(tmp) / "result.json"
        try:
            subprocess.run(
                [python, "-m", "bench.suite.child", step, str(out)],
                input=json.dumps(spec),
                text=True,
                env=env,
                timeout=timeout,
                check=True,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        except subprocess.CalledProcessError as exc:
            return {"error": f"the {step} process exited {exc.returncode}"}
        result: dict[str, Any] = json.loads(out.read_text())
        return result


PEER_MODULES = {
    "litdata": "litdata",
    "mosaic": "streaming",
    "hf": "datasets",
    "lance-plain": "lance",
    "grain": "grain",
}


def _python_for(loader: str, args: argparse.Namespace) -> str:
    """This interpreter, unless ``loader`` is a peer not importable here and --peer-python is set."""
    if (
        loader in PEERS
        and args.peer_python is not None
        and importlib.util.find_spec(PEER_MODULES[loader]) is None
    ):
        return str(args.peer_python)
    return sys.executable


def _row_files(data: DatasetSpec, loader: str) -> list[Path]:
    key = PREP_KEY[loader]
    if key in (None, "folk", "index"):
        roots = [data.directory] + ([data.prepared(key)] if key else [])
        return data_files(*roots)
    return data_files(data.prepared(key))


def run_suite(args: argparse.Namespace) -> dict[str, Any]:
    from bench.report import describe_machine

    conf = SUITES[args.suite]
    workers: tuple[int, ...] = args.workers or conf["workers"]
    command = shlex.join(["python", "-m", "bench", *sys.argv[1:]])
    machine = describe_machine(command)
    datasets = datasets_for(args.suite, args.data, args.kinds)
    if args.sizes is not None:
        datasets = [d for d in datasets if d.size in args.sizes]
    preps: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    partial = args.out / f"{args.name}.partial.json"
    kept = {}
    if args.resume and partial.exists():
        earlier = json.loads(partial.read_text())
        now = _settings(args, conf, workers, datasets)
        if earlier.get("settings") != now:
            raise SystemExit(
                f"--resume: {partial} was run with other settings ({earlier.get('settings')}); "
                f"this run's are {now}"
            )
        # rows that ran are kept; a row that failed or timed out is run again
        kept = {
            (r["dataset"], r["loader"], r["workers"]): r for r in earlier["rows"] if "samples" in r
        }
        print(f"-- resuming: {len(kept)} rows kept from {partial}", flush=True)
        machine["resumed"] = f"{len(kept)} rows kept from an earlier run (not in the wall time)"
    for data in datasets:
        ensure_pickles(data)
        size = tree_bytes(data.directory)
        keys = sorted({k for lo in args.loaders if (k := PREP_KEY[lo])})
        prep_of: dict[str, dict[str, Any]] = {}
        for key in keys:
            loader = next(lo for lo in args.loaders if PREP_KEY[lo] == key)
            print(f"-- prepare {data.name} {key}", flush=True)
            prep_of[key] = _child(
                _python_for(loader, args),
                "prepare",
                {"data": asdict(data), "key": key},
                conf["timeout"],
            )
            preps.append({"dataset": data.name, "key": key, **prep_of[key]})
            if "redone" in prep_of[key]:
                print(f"   {prep_of[key]['redone']}", flush=True)
            elif prep_of[key].get("reused"):
                print(f"   reused: made by this code, {prep_of[key]['code']}", flush=True)
        for w in workers:
            for loader in args.loaders:
                row_key = PREP_KEY[loader]
                base = {
                    "dataset": data.name,
                    "kind": data.kind,
                    "size": data.size,
                    "dataset_bytes": size,
                    "decoded_bytes": prep_of.get("index", {}).get("decoded_bytes"),
                    "samples_total": data.num_samples,
                    "loader": loader,
                    "workers": w,
                }
                if (data.name, loader, w) in kept:
                    rows.append(kept[(data.name, loader, w)])
                    continue
                prep = prep_of.get(row_key, {}) if row_key else {}
                if "error" in prep or "unavailable" in prep:
                    rows.append({**base, "unavailable": prep.get("unavailable") or prep["error"]})
                    continue
                files = _row_files(data, loader)
                if data.cold:
                    evict(files)
                else:
                    warm(files)
                row_spec = RowSpec(
                    loader, data, w, args.batch_size, conf["cache_bytes"], conf["folk_cap"]
                )
                print(f"-- {data.name} ({data.size}) {loader} workers={w}", flush=True)
                result = _child(
                    _python_for(loader, args), "row", row_spec.to_json(), conf["timeout"]
                )
                result.pop("traceback", None)
                row = {**base, "prep_s": prep.get("seconds"), **result}
                if "samples" in row:
                    rate = row["samples"] / row["seconds"] if row["seconds"] else 0.0
                    row["samples_per_s"] = rate
                    row["mb_per_s"] = rate * size / data.num_samples / 1e6
                    print(
                        f"   {rate:,.0f} samples/s, first batch {row['first_batch_s']:.2f} s, "
                        f"peak PSS {row['peak_pss'] / MiB:,.0f} MiB, "
                        f"fetched {row['bytes_fetched'] / 1e6:,.1f} MB",
                        flush=True,
                    )
                else:
                    print(f"   {row.get('unavailable') or row.get('error')}", flush=True)
                rows.append(row)
                _raw(args, machine, datasets, workers, conf, preps, rows, t_start, done=False)
    return _raw(args, machine, datasets, workers, conf, preps, rows, t_start, done=True)


def _settings(
    args: argparse.Namespace,
    conf: dict[str, Any],
    workers: tuple[int, ...],
    datasets: list[DatasetSpec],
) -> dict[str, Any]:
    return {
        "batch_size": args.batch_size,
        "cache_bytes": conf["cache_bytes"],
        "folk_cap": conf["folk_cap"],
        "workers": list(workers),
        "datasets": {
            d.name: KINDS[d.kind][2] + f", {d.num_samples:,} samples, {d.size}" for d in datasets
        },
    }


def _raw(
    args: argparse.Namespace,
    machine: dict[str, str],
    datasets: list[DatasetSpec],
    workers: tuple[int, ...],
    conf: dict[str, Any],
    preps: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    t_start: float,
    *,
    done: bool,
) -> dict[str, Any]:
    """The results so far; written after every row, so a run cut short still leaves its rows."""
    machine = dict(machine)
    machine["load average at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    machine["suite wall time"] = f"{time.perf_counter() - t_start:,.0f} s"
    raw = {
        "suite": args.suite,
        "complete": done,
        "machine": machine,
        "settings": _settings(args, conf, workers, datasets),
        "preparations": preps,
        "rows": rows,
    }
    if not done:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.partial.json").write_text(json.dumps(raw, indent=1) + "\n")
    return raw


def main(argv: list[str]) -> int:
    from .report import write_report

    args = parser().parse_args(argv)
    if args.quick:
        args.suite = "quick"
    if args.kinds is None:  # the quick suite is a smoke run of one kind
        args.kinds = tuple(KINDS) if args.suite == "full" else ("arrays12k",)
    name = args.name = args.name or f"suite-{args.suite}"
    if args.render is not None:
        raw = json.loads(args.render.read_text())
        write_report(raw, args.render.parent, args.render.stem)
        return 0
    raw = run_suite(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(raw, indent=1) + "\n")
    write_report(raw, args.out, name)
    (args.out / f"{name}.partial.json").unlink(missing_ok=True)
    return 0
