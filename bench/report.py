"""The benchmark's output: a description of the machine, a Markdown table, raw numbers as JSON."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from .measure import MiB
from .runner import RowResult

__all__ = [
    "TITLE",
    "busy_note",
    "describe_machine",
    "load_results",
    "markdown_report",
    "report_head",
    "results_json",
    "save_results",
    "table",
]

TITLE = "Whole-file PickleDataset vs naive and folk baselines"

LABELS = {
    "null": "null (no data: loop overhead)",
    "naive": "naive list (load everything)",
    "folk": "folk JSON + one-file cache",
    "pickleshard": "PickleDataset whole-file + BlockShuffleSampler",
    "span": "PickleDataset span mode + RandomSampler",
}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_commit(repo: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def describe_machine(command: str) -> dict[str, str]:
    """What the numbers depend on: CPU, cores, RAM, versions, load, date, the command line.

    Versions come from package metadata: importing torch here would map its libraries into the
    parent process and lower every row's PSS by sharing their pages.
    """
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "CPU": _cpu_model(),
        "cores": f"{os.cpu_count()} logical, {usable} usable by this process",
        "RAM": f"{psutil.virtual_memory().total / (1 << 30):.1f} GiB",
        "OS": platform.platform(),
        "Python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "pickleshard": f"{_version('pickleshard')} ({_git_commit(Path(__file__).parents[1])})",
        "load average at start": load,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
    }


def _ref(rows: Sequence[RowResult], kind: str, order: str, workers: int) -> RowResult | None:
    for r in rows:
        if (r.spec.kind, r.spec.order, r.spec.workers) == (kind, order, workers):
            return r
    return None


def _ratio(row: RowResult, ref: RowResult | None) -> float | None:
    if ref is None or ref.samples_per_s <= 0:
        return None
    return row.samples_per_s / ref.samples_per_s


def _fmt_ratio(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}x" if value >= 100 else f"{value:.2f}x"


def table(rows: Sequence[RowResult]) -> str:
    """The Markdown table, one line per row, ratios against the folk rows with the same workers."""
    head = [
        "dataset",
        "order",
        "workers",
        "index s",
        "samples",
        "seconds",
        "samples/s",
        "vs folk sequential",
        "vs folk shuffled",
        "PSS before epoch MiB",
        "peak PSS MiB",
        "PSS growth MiB",
        "peak alone MiB",
        "file loads",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        w = r.spec.workers
        cells = [
            LABELS[r.spec.kind],
            r.spec.order + (" (capped)" if r.capped else ""),
            str(w),
            "—" if r.index_s is None else f"{r.index_s:.2f}",
            f"{r.samples:,}",
            f"{r.seconds:.2f}",
            f"{r.samples_per_s:,.0f}",
            _fmt_ratio(_ratio(r, _ref(rows, "folk", "sequential", w))),
            _fmt_ratio(_ratio(r, _ref(rows, "folk", "shuffled", w))),
            f"{r.start_pss / MiB:,.0f}",
            f"{r.peak_pss / MiB:,.0f}",
            f"{(r.peak_pss - r.start_pss) / MiB:+,.0f}",
            f"{r.peak_alone / MiB:,.0f}",
            f"{r.file_loads:,}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(rows: Sequence[RowResult], cache_bytes: int, workers: int = 2) -> list[str]:
    """The comparisons that matter at ``workers``, stated as measured (the targets they are
    held to are in docs/benchmarks.md, not in a user's terminal or results file)."""
    ours = _ref(rows, "pickleshard", "shuffled", workers)
    if ours is None:
        return [f"- no PickleDataset shuffled row at {workers} workers"]
    out: list[str] = []
    for order in ("sequential", "shuffled"):
        ratio = _ratio(ours, _ref(rows, "folk", order, workers))
        if ratio is not None:
            out.append(
                f"- shuffled PickleDataset / folk {order} rate at {workers} workers: "
                f"{_fmt_ratio(ratio)}"
            )
    span = _ref(rows, "span", "shuffled", workers)
    if span is not None:
        out.append(
            f"- shuffled span-mode PickleDataset at {workers} workers: "
            f"{_fmt_ratio(_ratio(span, _ref(rows, 'folk', 'sequential', workers)))} folk "
            f"sequential, {_fmt_ratio(_ratio(span, _ref(rows, 'folk', 'shuffled', workers)))} "
            "folk shuffled"
        )
    null = _ref(rows, "null", "sequential", workers)
    folk_shuffled = _ref(rows, "folk", "shuffled", workers)
    if null is not None and folk_shuffled is not None:
        out.append(
            f"- the loop itself at {workers} workers (null row): "
            f"{null.samples_per_s:,.0f} samples/s = "
            f"{_fmt_ratio(_ratio(null, folk_shuffled))} folk shuffled"
        )
    if null is not None:
        for metric, mine, fixed in (
            ("peak PSS", ours.peak_pss, null.peak_pss),
            ("peak alone", ours.peak_alone, null.peak_alone),
        ):
            out.append(
                f"- shuffled PickleDataset {metric} at {workers} workers: {mine / MiB:,.0f} MiB = "
                f"the null row's {fixed / MiB:,.0f} MiB + {(mine - fixed) / MiB:,.0f} MiB "
                f"(cache budget {cache_bytes / MiB:,.0f} MiB)"
            )
    return out


def busy_note(machine: dict[str, str]) -> str | None:
    """A warning when other processes kept the CPUs busy as the run began, else None.

    Reads the 1-minute load average at start (before any row ran, so it is other processes'
    load) against the usable cores, both as :func:`describe_machine` wrote them.
    """
    load = re.match(r"\s*([0-9.]+)", machine.get("load average at start", ""))
    cores = re.search(r"(\d+) usable", machine.get("cores", ""))
    if load is None or cores is None:
        return None
    busy, usable = float(load.group(1)), int(cores.group(1))
    if busy < 0.5 * usable:
        return None
    return (
        f"**The machine was busy:** load average {busy:.2f} on {usable} usable cores before the "
        "first row. Other processes competed for the CPUs during the run, so throughput figures "
        "(and ratios between rows measured minutes apart) are noisy; re-run on a quiet machine "
        "before drawing conclusions from a small difference."
    )


def report_head(title: str, machine: dict[str, str]) -> list[str]:
    """The first lines of a results file: its title, the Machine section and, when the machine
    was busy, the warning (:func:`busy_note`)."""
    lines = [f"# {title}", "", "## Machine", "", *[f"- {k}: {v}" for k, v in machine.items()]]
    note = busy_note(machine)
    return [*lines, "", note] if note else lines


def save_results(out: Path, name: str, lines: list[str], raw: dict[str, Any]) -> None:
    """Write ``name.md`` (``lines``) and ``name.json`` (``raw``) to ``out``; print the report."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text("\n".join(lines))
    (out / f"{name}.json").write_text(json.dumps(raw, indent=1) + "\n")
    print("\n".join(lines))


def markdown_report(
    title: str,
    machine: dict[str, str],
    setup: dict[str, str],
    rows: Sequence[RowResult],
    cache_bytes: int,
) -> str:
    idle = statistics.median(r.idle_pss for r in rows) / MiB if rows else 0.0
    idle_alone = statistics.median(r.idle_alone for r in rows) / MiB if rows else 0.0
    parts = [f"# {title}", "", "## Machine", ""]
    parts += [f"- {k}: {'`' + v + '`' if k == 'command' else v}" for k, v in machine.items()]
    note = busy_note(machine)
    if note is not None:
        parts += ["", note]
    parts += ["", "## Setup", ""]
    parts += [f"- {k}: {v}" for k, v in setup.items()]
    parts += [
        f"- idle PSS of a row's process after importing torch, before building its dataset: "
        f"{idle:,.0f} MiB (alone: {idle_alone:,.0f} MiB; medians over rows)",
        "",
        "## Results",
        "",
        table(rows),
        "",
        "## Ratios (num_workers=2)",
        "",
        *ratios(rows, cache_bytes),
        "",
    ]
    return "\n".join(parts)


def results_json(
    title: str, machine: dict[str, str], setup: dict[str, str], rows: Sequence[RowResult]
) -> dict[str, Any]:
    return {"title": title, "machine": machine, "setup": setup, "rows": [asdict(r) for r in rows]}


def load_results(
    obj: dict[str, Any],
) -> tuple[str, dict[str, str], dict[str, str], list[RowResult]]:
    """Inverse of :func:`results_json`: ``(title, machine, setup, rows)``."""
    rows = [RowResult.from_json(r) for r in obj["rows"]]
    return str(obj.get("title", TITLE)), dict(obj["machine"]), dict(obj["setup"]), rows
