"""The index rows of ``python -m bench remote --latency-ms 0,20,50``: indexing a remote dataset
against downloading its files whole, at each added latency.

Two datasets in the seed layout, about the same size: *dense* (float32 ``(3, 32, 32)``, 12 KB
samples) and *sparse* (float32 ``(3, 112, 112)``, 150 KB samples). Each is served by two
loopback servers, each in a process of its own (:class:`pickleshard.testing.servers.ServerProcess`:
the client shares no interpreter lock with the server): the range server (HTTP/1.1 keep-alive,
Nagle off) and moto's S3, both adding the latency to every request. Per (server, latency,
dataset):

- ``download``: the files fetched whole through the same fsspec filesystem, concurrently
  (``fs.cat`` of every URL) and one after another; the faster is the baseline;
- ``index``: :func:`pickleshard.build_index` (``jobs=1``: one process) into a fresh folder; its
  seconds, the requests and bytes the server counted (listing and metadata included), per sample
  and as a share of the dataset, and its time over the download's.

The targets (issue 28): at 20 ms, the dense index within 2x the download and at most 0.01
requests a sample; the sparse index fetching at most 5% of the bytes.

What a dense file costs, one round trip after another: the lookup of every URL (all at once:
its identity, kept for the open), the object's head (16-64 KiB: the compression sniff, a
producer's header, the scan's first windows, enough to tell the file is dense), then the object
in one request (its bytes are the buffer the scan walks; the fingerprint is taken from them).
Four files go at once (:data:`pickleshard.indexing.build.REMOTE_FILES_AT_ONCE`), so the index
costs about two round trips, the download and the scans' CPU. A sparse file's windows are
predicted at the sample stride, 1, 2, 4... 64 ahead: about log2(samples) round trips a file,
then its fingerprint's blocks (one more). moto reads a whole object for every ranged GET, so a
sparse file's windows cost the S3 server a whole-object read each: its sparse rows say little
about S3.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from pickleshard import build_index
from pickleshard.io.remote.source import filesystem
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.testing.servers import ServerKind, ServerProcess

__all__ = ["index_lines", "measure_index"]

MB = 1e6
DATASETS = {"dense 12 KB": ((3, 32, 32), 2500), "sparse 150 KB": ((3, 112, 112), 200)}


def _download(fs: Any, urls: list[str]) -> tuple[float, float]:
    """Seconds to fetch every object whole: all at once, and one after another."""
    t0 = time.perf_counter()
    fs.cat(urls)
    together = time.perf_counter() - t0
    t0 = time.perf_counter()
    for u in urls:
        fs.cat_file(u)
    return together, time.perf_counter() - t0


def _rows_for(
    kind: ServerKind,
    name: str,
    paths: list[Path],
    latencies: list[int],
    work: Path,
    repeats: int,
) -> list[dict[str, Any]]:
    total = sum(p.stat().st_size for p in paths)
    if kind == "http":
        files = {f"{name.split()[0]}/{p.name}": p for p in paths}
    else:
        files = {f"bench/{name.split()[0]}/{p.name}": p for p in paths}
    server = ServerProcess(kind, files).start()
    rows = []
    try:
        if kind == "http":
            urls = [f"{server.url}/{n}" for n in files]
            options: dict[str, Any] | None = None
        else:
            urls = [f"s3://{n}" for n in files]
            options = server.options()
        fs, _ = filesystem(urls[0], options)
        samples = 0
        for ms in latencies:
            server.set_latency(ms / 1000)
            best_dl = min((_download(fs, urls) for _ in range(repeats)), key=min)
            runs = []
            for r in range(repeats):
                server.reset()
                t0 = time.perf_counter()
                idx = build_index(
                    urls, index=work / f"{kind}-{ms}-{r}", jobs=1, storage_options=options
                )
                seconds = time.perf_counter() - t0
                runs.append((seconds, server.traffic()))
                samples = idx.num_samples
            seconds, traffic = min(runs, key=lambda run: run[0])
            baseline = min(best_dl)
            rows.append(
                {
                    "server": kind,
                    "latency_ms": ms,
                    "dataset": name,
                    "samples": samples,
                    "dataset_bytes": total,
                    "download_concurrent_s": round(best_dl[0], 3),
                    "download_sequential_s": round(best_dl[1], 3),
                    "index_s": round(seconds, 3),
                    "index_runs_s": [round(s, 3) for s, _ in runs],
                    "x_download": round(seconds / baseline, 2),
                    "requests": traffic["requests"],
                    "requests_per_sample": round(traffic["requests"] / samples, 4),
                    "bytes": traffic["sent"],
                    "x_dataset": round(traffic["sent"] / total, 4),
                }
            )
            print(rows[-1], flush=True)
    finally:
        server.stop()
    return rows


def measure_index(
    latencies: list[int], servers: list[ServerKind], repeats: int = 2
) -> dict[str, Any]:
    """The index rows for every server, latency and dataset (see the module docstring)."""
    work = Path(tempfile.mkdtemp(prefix="bench-remote-index-"))
    os.environ["PICKLESHARD_INDEX_HOME"] = str(work / "home")
    rows: list[dict[str, Any]] = []
    for name, (shape, per_file) in DATASETS.items():
        paths = write_synthetic(work / name.split()[0], files=4, per_file=per_file, shape=shape)
        for kind in servers:
            rows += _rows_for(kind, name, paths, latencies, work / "indexes", repeats)
    return {"index_rows": rows}


def index_lines(raw: dict[str, Any]) -> list[str]:
    """The Markdown table of :func:`measure_index`'s rows."""
    lines = [
        "",
        "## Indexing a remote dataset vs downloading it whole",
        "",
        "Each server in its own process on 127.0.0.1, adding the latency to every request; "
        "4 files a dataset; `build_index(urls, jobs=1)`; requests and bytes counted by the "
        "server (listing and metadata included); best of the runs. The baseline is the faster "
        "of downloading the files concurrently or one after another, through the same fsspec "
        "filesystem.",
        "",
        "| server | latency | dataset | samples | MB | download (concurrent / sequential) s "
        "| index s | x download | requests | requests/sample | bytes fetched | x dataset |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in raw["index_rows"]:
        lines.append(
            f"| {r['server']} | {r['latency_ms']} ms | {r['dataset']} | {r['samples']} | "
            f"{r['dataset_bytes'] / MB:.1f} | {r['download_concurrent_s']} / "
            f"{r['download_sequential_s']} | {r['index_s']} | **{r['x_download']}** | "
            f"{r['requests']} | {r['requests_per_sample']} | {r['bytes'] / MB:.2f} MB | "
            f"{r['x_dataset']} |"
        )
    return lines
