"""A PNG of the results: samples/s (log scale) and peak PSS per row, when matplotlib is present."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .measure import MiB
from .runner import RowResult

__all__ = ["write_plot"]

COLORS = {
    "null": "#999999",
    "naive": "#4c72b0",
    "folk": "#dd8452",
    "pickleshard": "#55a868",
    "span": "#8172b3",
}


def write_plot(rows: Sequence[RowResult], path: Path, title: str) -> bool:
    """Write the plot to ``path``; False (and nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r.spec.kind} {r.spec.order} w={r.spec.workers}" for r in rows]
    colors = [COLORS[r.spec.kind] for r in rows]
    y = list(range(len(rows)))[::-1]
    fig, (rate, mem) = plt.subplots(1, 2, figsize=(12, 0.4 * len(rows) + 1.5), sharey=True)
    rate.barh(y, [max(r.samples_per_s, 1e-3) for r in rows], color=colors)
    rate.set_xscale("log")
    rate.set_xlabel("samples/s (log)")
    rate.set_yticks(y, labels)
    mem.barh(y, [r.peak_pss / MiB for r in rows], color=colors)
    mem.set_xlabel("peak PSS, main + workers (MiB)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
