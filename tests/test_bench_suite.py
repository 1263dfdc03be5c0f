"""The loader suite's harness (``python -m bench --suite quick``) on a subset of its loaders.

Runs the real harness, each preparation and row in its own process, on the quick 12 KB-array
dataset (cold: its files evicted before each row) and checks what the report rests on: every
row delivered every sample of its epoch, the cold rows fetched the bytes they read from storage,
and the JSON, the Markdown and the four plots are written; a run resumed from a partial result
keeps the rows it already had.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_suite_runs_rows_and_reports(tmp_path: Path) -> None:
    loaders = "naive,span,memmap-plain,folk-shuffled,memmap"
    cmd = [sys.executable, "-m", "bench", "--suite", "quick", "--kinds", "arrays12k"]
    cmd += ["--loaders", loaders, "--data", str(tmp_path / "data"), "--out", str(tmp_path)]
    cmd += ["--resume"]
    kept = {
        "dataset": "arrays12k-4x500", "kind": "arrays12k", "size": "cold",
        "dataset_bytes": 1, "samples_total": 2000, "loader": "memmap", "workers": 0,
        "prep_s": 1.0, "open_s": 0.1, "note": "kept from the cut-short run", "samples": 128,
        "first_batch_s": 0.1, "seconds": 1.0, "start_pss": 1, "peak_pss": 1 << 20,
        "pss_series": [[0.0, 1 << 20]], "bytes_fetched": 0, "samples_per_s": 128.0,
        "mb_per_s": 0.0,
    }  # fmt: skip
    failed = {**kept, "loader": "naive", "error": "timed out after 120 s"}
    for key in ("samples", "seconds", "samples_per_s"):
        del failed[key]
    settings = {
        "batch_size": 64, "cache_bytes": 8 << 20, "folk_cap": 128, "workers": [0],
        "datasets": {
            "arrays12k-4x500": "float32 (3, 32, 32) arrays (12 KB) + int labels, 2,000 samples, cold"
        },
    }  # fmt: skip
    partial = {"settings": settings, "rows": [kept, failed]}  # the failed row runs again
    (tmp_path / "suite-quick.partial.json").write_text(json.dumps(partial))
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    raw = json.loads((tmp_path / "suite-quick.json").read_text())
    rows = {r["loader"]: r for r in raw["rows"]}
    assert set(rows) == set(loaders.split(","))
    total = rows["span"]["samples_total"]
    for name in ("naive", "span", "memmap-plain"):
        assert rows[name]["samples"] == total, rows[name]
        assert rows[name]["seconds"] > 0
        assert rows[name]["peak_pss"] > 0
    assert rows["folk-shuffled"]["samples"] == min(128, total)  # the quick suite's cap
    assert rows["memmap"] == kept  # resumed: not run again
    assert not (tmp_path / "suite-quick.partial.json").exists()
    # cold rows: the pickles (or the converted copy) were evicted, so reading every sample
    # fetched at least most of their bytes from storage
    assert rows["span"]["bytes_fetched"] >= 0.5 * rows["span"]["dataset_bytes"]
    assert rows["memmap-plain"]["bytes_fetched"] >= 0.5 * rows["span"]["dataset_bytes"]
    report = (tmp_path / "suite-quick.md").read_text()
    assert "PickleDataset span reads + ShuffleSampler" in report
    # each dataset's decoded size as the index sizes it, against the cache budget
    decoded = rows["span"]["decoded_bytes"]
    assert decoded >= 0.9 * rows["span"]["dataset_bytes"]  # float32 arrays: about their bytes
    assert f"{decoded / (1 << 20):,.0f} MiB decoded, {decoded / (8 << 20):.1f}x the cache" in report
    # the summary divides span's rate by each other loader's
    naive = rows["naive"]["samples_per_s"]
    ratio = max(rows["span"]["samples_per_s"], 0) / naive
    assert f"| naive | {ratio:,.2f}x (" in report
    assert f"| memmap | {rows['span']['samples_per_s'] / 128.0:,.2f}x (" in report
    for plot in ("summary", "throughput", "pss", "prep"):
        assert (tmp_path / f"suite-quick-{plot}.png").stat().st_size > 1000
