"""The suite's report: pickleshard against every other loader, a Markdown table per dataset, the
preparations, and four PNG plots.

The summary divides pickleshard's shuffled rate on the pickles themselves (the better of span
reads and whole-file, as :data:`OURS` says) by each other loader's rate on the same dataset and
worker count: above 1x pickleshard leads, below it trails. Plots (when matplotlib is
installed): the summary (samples/s and peak PSS of the loaders a user chooses between, one
group per dataset); samples/s per loader for each dataset and worker count; PSS over the epoch
per loader (one panel per dataset, the largest worker count); and each loader's preparation
time (index or conversion) per dataset.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from .plan import LOADERS, loader_label

__all__ = ["OURS", "SUMMARY_LOADERS", "leads_and_trails", "markdown", "write_report"]

MiB = 1 << 20

#: pickleshard reading the pickles in place, shuffled
OURS = ("span", "whole", "span-collate", "loader")
#: the loaders the summary plot shows, in its order
SUMMARY_LOADERS = (
    "naive",
    "folk-shuffled",
    "span",
    "whole",
    "memmap-plain",
    "lmdb-plain",
    "webdataset-plain",
    "litdata",
    "mosaic",
    "hf",
)


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _by_dataset(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        out[row["dataset"]].append(row)
    return out


def _table(rows: list[dict[str, Any]]) -> list[str]:
    ref = {r["workers"]: r for r in rows if r["loader"] == "span" and "samples" in r}
    lines = [
        "| loader | workers | prep s | open s | first batch s | samples/s | MB/s | vs span | "
        "peak PSS MiB | fetched MB | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        label = loader_label(r["loader"])
        if "samples" not in r:
            why = r.get("unavailable") or r.get("error") or "did not run"
            lines.append(f"| {label} | {r['workers']} | — | — | — | — | — | — | — | — | {why} |")
            continue
        span = ref.get(r["workers"])
        vs = r["samples_per_s"] / span["samples_per_s"] if span else None
        note = r.get("note", "")
        lines.append(
            f"| {label} | {r['workers']} | {_fmt(r.get('prep_s'), '.1f')} | {r['open_s']:.2f} | "
            f"{r['first_batch_s']:.2f} | {r['samples_per_s']:,.0f} | {r['mb_per_s']:,.1f} | "
            f"{_fmt(vs, '.2f')}{'x' if vs is not None else ''} | {r['peak_pss'] / MiB:,.0f} | "
            f"{r['bytes_fetched'] / 1e6:,.1f} | {note} |"
        )
    return lines


def _ran(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    return {(r["dataset"], r["loader"], r["workers"]): r for r in rows if "samples" in r}


def leads_and_trails(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """For each dataset, worker count and other loader that ran: pickleshard's rate (the better
    of :data:`OURS`) divided by that loader's; ``ratio`` > 1 where pickleshard leads."""
    ran = _ran(raw["rows"])
    out = []
    for (dataset, loader, workers), row in ran.items():
        if loader in OURS:
            continue
        ours = [ran[(dataset, o, workers)] for o in OURS if (dataset, o, workers) in ran]
        if not ours or row["samples_per_s"] <= 0 or row["peak_pss"] <= 0:
            continue
        best = max(ours, key=lambda r: r["samples_per_s"])
        out.append(
            {
                "dataset": dataset,
                "size": row["size"],
                "workers": workers,
                "loader": loader,
                "ours": best["loader"],
                "ratio": best["samples_per_s"] / row["samples_per_s"],
                "pss_ratio": best["peak_pss"] / row["peak_pss"],
            }
        )
    return out


def _summary(raw: dict[str, Any]) -> list[str]:
    pairs = leads_and_trails(raw)
    if not pairs:
        return []
    order = list(_by_dataset(raw["rows"]))  # datasets in the run's order, then workers
    columns = sorted(
        {(p["dataset"], p["workers"]) for p in pairs}, key=lambda c: (c[1], order.index(c[0]))
    )
    cell = {(p["loader"], p["dataset"], p["workers"]): p for p in pairs}
    lines = [
        "",
        "## pickleshard against each loader",
        "",
        "pickleshard's shuffled samples/s on the pickles themselves (the better of span reads and "
        "whole-file) divided by the loader's, same dataset and workers: **above 1x pickleshard "
        "leads**, below it trails. In brackets: the peak PSS ratio (below 1x pickleshard uses "
        "less memory).",
        "",
        "| loader | " + " | ".join(f"{d} w={w}" for d, w in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for loader in LOADERS:
        if loader in OURS or not any((loader, d, w) in cell for d, w in columns):
            continue
        cells = []
        for d, w in columns:
            p = cell.get((loader, d, w))
            cells.append("—" if p is None else f"{p['ratio']:,.2f}x ({p['pss_ratio']:.2f}x)")
        lines.append(f"| {loader} | " + " | ".join(cells) + " |")
    return lines


def markdown(raw: dict[str, Any], plots: list[str]) -> str:
    out = [f"# Loader suite ({raw['suite']})", "", "## Machine", ""]
    out += [f"- {k}: {v}" for k, v in raw["machine"].items()]
    s = raw["settings"]
    out += [
        "",
        "## Setup",
        "",
        f"- loop: `DataLoader(ds, batch_size={s['batch_size']}, sampler=..., num_workers=W)`, "
        "W in " + ", ".join(str(w) for w in s["workers"]) + "; arrays collated by default and "
        "touched as `xb.float().sum()`, object samples kept as a list; one fresh process per row",
        f"- whole-file cache budget {s['cache_bytes'] / MiB:,.0f} MiB; folk shuffled capped at "
        f"{s['folk_cap']:,} samples",
        "- cold datasets: every file the row reads (the pickles, or the loader's converted copy) "
        "evicted with `posix_fadvise(DONTNEED)` before the row; cached ones read once before it",
        "- prep s: the loader's own index or conversion of the same pickles, once per dataset",
        "- open s: opening the dataset in the row's process (the naive list loads every file here)",
        "- first batch: from creating the DataLoader iterator (workers start) to the first batch",
        "- MB/s: samples/s x the pickles' bytes per sample",
        "- peak PSS: this process + its workers, sampled every 0.1 s",
        "- fetched: `read_bytes` of `/proc/self/io` over the open and the epoch (reaped workers "
        "included)",
        "",
        "## Datasets",
        "",
    ]
    out += [f"- `{name}`: {desc}" for name, desc in s["datasets"].items()]
    out += _summary(raw)
    for name, rows in _by_dataset(raw["rows"]).items():
        size = rows[0]["dataset_bytes"] / 1e6
        decoded = rows[0].get("decoded_bytes")
        held = (
            f"; {decoded / MiB:,.0f} MiB decoded, {decoded / s['cache_bytes']:.1f}x the cache "
            "budget"
            if decoded
            else ""
        )
        out += ["", f"## {name} ({rows[0]['size']}, {size:,.0f} MB of pickles{held})", ""]
        out += _table(rows)
    out += [
        "",
        "## Preparations",
        "",
        "| dataset | what | seconds | output MB | tool |",
        "|---|---|---:|---:|---|",
    ]
    for p in raw["preparations"]:
        if "seconds" in p:
            out.append(
                f"| {p['dataset']} | {p['key']} | {p['seconds']:.1f} | "
                f"{p['bytes'] / 1e6:,.1f} | {p['tool']}{_made_by(p)} |"
            )
        else:
            why = p.get("unavailable") or p.get("error")
            out.append(f"| {p['dataset']} | {p['key']} | — | — | {why} |")
    out += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(out) + "\n"


def _made_by(prep: dict[str, Any]) -> str:
    """Which code made a preparation, and whether this run reused or remade it."""
    if "code" not in prep:
        return ""
    how = "; reused from an earlier run" if prep.get("reused") else ""
    how += f"; {prep['redone']}" if prep.get("redone") else ""
    return f"; made by pickleshard {prep['code']}{how}"


def _plots(raw: dict[str, Any], out: Path, name: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    loaders = list(LOADERS)
    colors = {lo: plt.get_cmap("tab20")(i) for i, lo in enumerate(loaders)}
    groups = _by_dataset(raw["rows"])
    written = [_summary_plot(raw, out, name, plt)]

    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 3.2 * len(groups)), squeeze=False)
    for ax, (dname, rows) in zip(axes[:, 0], groups.items(), strict=True):
        ran = [r for r in rows if "samples" in r]
        labels = [f"{r['loader']} w={r['workers']}" for r in ran]
        ax.barh(
            range(len(ran))[::-1],
            [max(r["samples_per_s"], 1e-3) for r in ran],
            color=[colors[r["loader"]] for r in ran],
        )
        ax.set_yticks(range(len(ran))[::-1], labels, fontsize=7)
        ax.set_xscale("log")
        ax.set_title(f"{dname} ({rows[0]['size']}): samples/s (log)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / f"{name}-throughput.png", dpi=90)
    plt.close(fig)
    written.append(f"{name}-throughput.png")

    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 3.2 * len(groups)), squeeze=False)
    for ax, (dname, rows) in zip(axes[:, 0], groups.items(), strict=True):
        top = max(r["workers"] for r in rows)
        for r in rows:
            if r["workers"] == top and "pss_series" in r:
                t = [p[0] for p in r["pss_series"]]
                ax.plot(
                    t,
                    [p[1] / MiB for p in r["pss_series"]],
                    label=r["loader"],
                    color=colors[r["loader"]],
                )
        ax.set_title(f"{dname} ({rows[0]['size']}), {top} workers: PSS over the epoch", fontsize=9)
        ax.set_xlabel("seconds")
        ax.set_ylabel("MiB")
        ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(out / f"{name}-pss.png", dpi=90)
    plt.close(fig)
    written.append(f"{name}-pss.png")

    preps = [p for p in raw["preparations"] if "seconds" in p]
    if preps:
        fig, ax = plt.subplots(figsize=(11, 0.25 * len(preps) + 1.5))
        ax.barh(range(len(preps))[::-1], [p["seconds"] for p in preps])
        ax.set_yticks(
            range(len(preps))[::-1], [f"{p['dataset']} {p['key']}" for p in preps], fontsize=7
        )
        ax.set_xlabel("index / convert seconds")
        fig.tight_layout()
        fig.savefig(out / f"{name}-prep.png", dpi=90)
        plt.close(fig)
        written.append(f"{name}-prep.png")
    return written


def _summary_plot(raw: dict[str, Any], out: Path, name: str, plt: Any) -> str:
    """Samples/s and peak PSS of :data:`SUMMARY_LOADERS`, one group per dataset, at the largest
    worker count that ran."""
    ran = _ran(raw["rows"])
    datasets = list(_by_dataset(raw["rows"]))
    workers = max(r["workers"] for r in raw["rows"])
    loaders = [lo for lo in SUMMARY_LOADERS if any((d, lo, workers) in ran for d in datasets)]
    colors = {lo: plt.get_cmap("tab10")(i) for i, lo in enumerate(SUMMARY_LOADERS)}
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    width = 0.8 / max(len(loaders), 1)
    for ax, key, scale, title in (
        (axes[0], "samples_per_s", 1.0, f"shuffled samples/s, {workers} workers (log)"),
        (axes[1], "peak_pss", 1 / MiB, f"peak PSS MiB, main + {workers} workers"),
    ):
        for k, loader in enumerate(loaders):
            xs, ys = [], []
            for i, d in enumerate(datasets):
                row = ran.get((d, loader, workers))
                if row is not None:
                    xs.append(i + (k - len(loaders) / 2 + 0.5) * width)
                    ys.append(max(row[key] * scale, 1e-3))
            ax.bar(xs, ys, width, label=loader_label(loader), color=colors[loader])
        sizes = {d: rows[0]["size"] for d, rows in _by_dataset(raw["rows"]).items()}
        ax.set_xticks(range(len(datasets)), [f"{d}\n({sizes[d]})" for d in datasets], fontsize=7)
        ax.set_title(title, fontsize=9)
        if key == "samples_per_s":
            ax.set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)
    fig.tight_layout(rect=(0, 0.17, 1, 1))
    fig.savefig(out / f"{name}-summary.png", dpi=90)
    plt.close(fig)
    return f"{name}-summary.png"


def write_report(raw: dict[str, Any], out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plots = _plots(raw, out, name)
    text = markdown(raw, plots)
    (out / f"{name}.md").write_text(text)
    print(text)
    print(f"wrote {out / name}.md")
