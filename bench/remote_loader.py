"""The loader rows of ``python -m bench remote --latency-ms 0,20,50``: a shuffled epoch of 12 KB
arrays read locally, over a remote store by ``DataLoader`` and by :class:`pickleshard.Loader`,
and downloaded whole first, at each added latency.

The issue's dataset: 4 seed-layout pickles of float32 ``(3, 32, 32)`` arrays (12 KB), served by
the range server (and moto's S3 with ``--servers http,s3``), each in a process of its own
(:class:`~pickleshard.testing.servers.ServerProcess`) adding the latency to every request. Rows:

- ``local DataLoader`` (``num_workers=0`` and ``2``, ``collate_fn=pickleshard.collate``) and
  ``local Loader`` (its default for local files, ``threads=0``: read in the loop's thread; then
  ``threads=1`` and ``2`` with ``prefetch=2``, reading ahead): the same files, page cache warm,
  each the best of :data:`LOCAL_PASSES` epochs (once, not per latency);
- per latency: ``remote DataLoader`` (``num_workers=0``, over the first ``--dl-samples`` of the
  epoch: at 20 ms a whole epoch takes minutes), ``remote Loader`` (``--prefetch`` batches in
  flight, a whole epoch; PSS of the process measured; the time to its first batch, the
  files' opening included, and its CPU time), ``download then read`` (the files fetched
  whole, concurrently, plus a local index and a local Loader epoch), and at 0 ms the client's
  own request-rate ceiling (``fs.cat_ranges`` of ``--ceiling-ranges`` random sample ranges at
  once through the same filesystem object);
- each remote row: the requests and bytes the server counted, requests/s against S3's documented
  5,500 GET/s per prefix.

Before the first latency, an untimed pass over 16 batches (the process's first remote epoch
pays once for its thread pools and the stage's pages). The first batches of each remote row are
checked against the local dataset's.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pickleshard import Loader, PickleDataset, ShuffleSampler, build_index, collate
from pickleshard.io.remote.source import filesystem
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.testing.servers import ServerKind, ServerProcess

from .measure import PeakTreeMemory

__all__ = ["loader_lines", "measure_loader", "write_loader_plot"]

MB = 1e6
S3_GETS_PER_PREFIX = 5500
SHAPE, PER_FILE, FILES = (3, 32, 32), 2500, 4
LOCAL_PASSES = 7  # a local row is the best of this many epochs


def _same_start(got: list[Any], local: PickleDataset, order: list[int], batch: int) -> None:
    """The first batches equal the local dataset's samples (a wrong read would show)."""
    for k, (x, y) in enumerate(got):
        want = [local[i] for i in order[k * batch : (k + 1) * batch]]
        if not all(
            np.array_equal(x[j].numpy(), w[0]) and int(y[j]) == w[1] for j, w in enumerate(want)
        ):
            raise AssertionError(f"batch {k} differs from the local files")


def _dataloader(ds: Any, order: list[int], batch: int, workers: int) -> tuple[float, list[Any]]:
    import torch

    loader = torch.utils.data.DataLoader(
        ds, batch_size=batch, sampler=order, num_workers=workers, collate_fn=collate
    )
    first: list[Any] = []
    t0 = time.perf_counter()
    for b in loader:
        if len(first) < 3:
            first.append(b)
    return time.perf_counter() - t0, first


def _loader(
    ds: Any, batch: int, prefetch: int, threads: int | None = None
) -> tuple[float, list[Any], Loader, int, float]:
    loader = Loader(
        ds, batch, sampler=ShuffleSampler(ds, seed=0), prefetch=prefetch, threads=threads
    )
    first: list[Any] = []
    with PeakTreeMemory() as memory:
        t0 = time.perf_counter()
        first_s = 0.0
        for b in loader:
            if not first:
                first_s = time.perf_counter() - t0
            if len(first) < 3:
                first.append(b)
        seconds = time.perf_counter() - t0
    return seconds, first, loader, memory.peak_pss - memory.start.pss, first_s


def _row(name: str, seconds: float, samples: int, **extra: Any) -> dict[str, Any]:
    return {
        "row": name,
        "seconds": round(seconds, 3),
        "samples": samples,
        "samples_per_s": round(samples / seconds, 1),
        **extra,
    }


def _traffic(server: ServerProcess, seconds: float, total: int, samples: int) -> dict[str, Any]:
    t = server.traffic()
    return {
        "requests": t["requests"],
        "requests_per_s": round(t["requests"] / seconds, 1),
        "x_s3_prefix": round(t["requests"] / seconds / S3_GETS_PER_PREFIX, 3),
        "requests_per_sample": round(t["requests"] / samples, 3),
        "bytes": t["sent"],
        "x_sample_bytes": round(t["sent"] / total, 3),
    }


def measure_loader(
    latencies: list[int],
    servers: list[ServerKind],
    *,
    batch: int = 64,
    prefetch: int = 16,
    dl_samples: int = 2000,
    ceiling_ranges: int = 2000,
) -> dict[str, Any]:
    """The loader rows (see the module docstring)."""
    work = Path(tempfile.mkdtemp(prefix="bench-remote-loader-"))
    os.environ["PICKLESHARD_INDEX_HOME"] = str(work / "home")
    paths = write_synthetic(work / "dense", files=FILES, per_file=PER_FILE, shape=SHAPE)
    local = PickleDataset(work / "dense")
    order = list(ShuffleSampler(local, seed=0))
    n = len(order)
    sample_bytes = n * int(np.prod(SHAPE)) * 4
    rows: list[dict[str, Any]] = []
    # local rows: the best of LOCAL_PASSES epochs each, taken in rounds (every row once a
    # round), so that whatever else the machine runs weighs on each row alike: an epoch is a
    # fraction of a second
    _dataloader(local, order, batch, 0)  # warm the page cache and the readers
    names = [f"local DataLoader (num_workers={w})" for w in (0, 2)]
    # the Loader's default for local files (threads=0: read in the loop's thread), then
    # reading ahead in 1 and 2 threads (what the default gives up: the measured reason for it)
    names += ["local Loader (threads=0, default)", "local Loader (threads=1)"]
    names += ["local Loader (threads=2)"]
    runs: dict[str, list[tuple[float, int | None]]] = {name: [] for name in names}
    for _ in range(LOCAL_PASSES):
        for workers in (0, 2):
            seconds = _dataloader(local, order, batch, workers)[0]
            runs[f"local DataLoader (num_workers={workers})"].append((seconds, None))
        for threads, name in zip((None, 1, 2), names[2:], strict=True):
            seconds, _, _, pss, _ = _loader(local, batch, 2, threads)
            runs[name].append((seconds, pss))
    for name, got in runs.items():
        pss_seen = [p for _, p in got if p is not None]
        rows.append(
            _row(
                name,
                min(t for t, _ in got),
                n,
                latency_ms=None,
                pss=max(pss_seen) if pss_seen else None,
            )
        )
    for kind in servers:
        rows += _remote_rows(
            kind,
            paths,
            local,
            order,
            latencies,
            work,
            batch,
            prefetch,
            dl_samples,
            ceiling_ranges,
            sample_bytes,
        )
    return {"loader_rows": rows, "samples": n, "sample_bytes": sample_bytes, "batch": batch}


def _remote_rows(
    kind: ServerKind,
    paths: list[Path],
    local: PickleDataset,
    order: list[int],
    latencies: list[int],
    work: Path,
    batch: int,
    prefetch: int,
    dl_samples: int,
    ceiling_ranges: int,
    sample_bytes: int,
) -> list[dict[str, Any]]:
    files = {(f"dense/{p.name}" if kind == "http" else f"bench/dense/{p.name}"): p for p in paths}
    server = ServerProcess(kind, files).start()
    rows: list[dict[str, Any]] = []
    n = len(order)
    try:
        if kind == "http":
            urls = [f"{server.url}/{name}" for name in files]
            options: dict[str, Any] | None = None
        else:
            urls = [f"s3://{name}" for name in files]
            options = server.options()
        build_index(urls, index=work / f"index-{kind}", jobs=1, storage_options=options)
        fs, _ = filesystem(urls[0], options)
        # one untimed pass over a few batches first: the process's first remote epoch pays
        # once for what every later one reuses (thread pools, the stage's pages), and would
        # charge it to whichever latency came first
        warm = PickleDataset(urls, index=work / f"index-{kind}", storage_options=options)
        for _ in Loader(warm, batch, sampler=order[: 16 * batch], prefetch=prefetch):
            pass
        for ms in latencies:
            server.set_latency(ms / 1000)
            ds = PickleDataset(urls, index=work / f"index-{kind}", storage_options=options)
            some = order[:dl_samples]
            server.reset()
            seconds, first = _dataloader(ds, some, batch, 0)
            _same_start(first, local, some, batch)
            rows.append(
                _row(
                    f"{kind} DataLoader (num_workers=0)",
                    seconds,
                    len(some),
                    latency_ms=ms,
                    **_traffic(server, seconds, sample_bytes * len(some) // n, len(some)),
                )
            )
            ds = PickleDataset(urls, index=work / f"index-{kind}", storage_options=options)
            server.reset()
            seconds, first, loader, pss, first_s = _loader(ds, batch, prefetch)
            _same_start(first, local, order, batch)
            rows.append(
                _row(
                    f"{kind} Loader (prefetch={prefetch})",
                    seconds,
                    n,
                    latency_ms=ms,
                    pss=pss,
                    first_batch_s=round(first_s, 3),
                    stats=loader.stats.as_json(),
                    **_traffic(server, seconds, sample_bytes, n),
                )
            )
            rows.append(
                _download_then_read(
                    fs, urls, work / f"dl-{kind}-{ms}", batch, prefetch, kind, ms, n
                )
            )
            if ms == 0:
                rows.append(_ceiling(fs, urls, local, kind, ceiling_ranges))
            print(rows[-3:], flush=True)
    finally:
        server.stop()
    return rows


def _download_then_read(
    fs: Any, urls: list[str], out: Path, batch: int, prefetch: int, kind: str, ms: int, n: int
) -> dict[str, Any]:
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    for url, data in zip(
        urls, fs.cat(urls).values() if len(urls) > 1 else [fs.cat(urls[0])], strict=True
    ):
        (out / url.rsplit("/", 1)[1]).write_bytes(data)
    download = time.perf_counter() - t0
    ds = PickleDataset(out)  # the index is built here, inside the row's time
    index = time.perf_counter() - t0 - download
    seconds, _, _, _, _ = _loader(ds, batch, prefetch)
    total = download + index + seconds
    return _row(
        f"{kind} download then read (Loader)",
        total,
        n,
        latency_ms=ms,
        download_s=round(download, 3),
        index_s=round(index, 3),
    )


def _ceiling(fs: Any, urls: list[str], local: PickleDataset, kind: str, k: int) -> dict[str, Any]:
    """The client's request rate: ``k`` random sample-sized ranges at once, one cat_ranges."""
    rng = np.random.default_rng(1)
    size = fs.size(urls[0])
    starts = rng.integers(0, size - 12288, k).tolist()
    t0 = time.perf_counter()
    fs.cat_ranges([urls[0]] * k, starts, [s + 12288 for s in starts])
    seconds = time.perf_counter() - t0
    return _row(
        f"{kind} client ceiling (cat_ranges of {k})",
        seconds,
        k,
        latency_ms=0,
        requests_per_s=round(k / seconds, 1),
    )


def loader_lines(raw: dict[str, Any]) -> list[str]:
    """The Markdown table of :func:`measure_loader`'s rows."""
    lines = [
        "",
        "## A shuffled epoch: local, remote DataLoader, remote Loader, download then read",
        "",
        f"{raw['samples']} float32 (3, 32, 32) samples (12 KB), 4 files, batches of "
        f"{raw['batch']}; ShuffleSampler(seed=0). Remote rows: each server in its own process "
        "on 127.0.0.1 adding the latency per request; requests and bytes counted by it. "
        "PSS: growth of this process's PSS over the row.",
        "",
        "| row | latency | samples | seconds | samples/s | requests/s (x S3 prefix) | "
        "requests/sample | bytes x samples' | PSS MB | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in raw["loader_rows"]:
        lat = "-" if r["latency_ms"] is None else f"{r['latency_ms']} ms"
        rps = (
            f"{r['requests_per_s']} ({r['x_s3_prefix']})"
            if "x_s3_prefix" in r
            else (f"{r['requests_per_s']}" if "requests_per_s" in r else "-")
        )
        note = ""
        if "download_s" in r:
            note = f"download {r['download_s']} s + index {r['index_s']} s + epoch"
        elif "stats" in r:
            st = r["stats"]
            note = (
                f"first batch {r['first_batch_s']} s, wait {st['wait_s']} s, CPU "
                f"{st['cpu_s']} s, in flight mean {st['mean_in_flight']}"
            )
        pss = f"{r['pss'] / MB:.1f}" if r.get("pss") is not None else "-"
        lines.append(
            f"| {r['row']} | {lat} | {r['samples']} | {r['seconds']} | **{r['samples_per_s']}** "
            f"| {rps} | {r.get('requests_per_sample', '-')} | {r.get('x_sample_bytes', '-')} "
            f"| {pss} | {note} |"
        )
    return lines + _target_lines(raw["loader_rows"])


def _target_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's loader targets, each as measured in this run (ratios between its rows)."""

    def rate(prefix: str, ms: int | None) -> float | None:
        got = [r for r in rows if r["row"].startswith(prefix) and r["latency_ms"] == ms]
        return got[0]["samples_per_s"] if got else None

    def row(prefix: str, ms: int | None) -> dict[str, Any]:
        return next(r for r in rows if r["row"].startswith(prefix) and r["latency_ms"] == ms)

    lines = ["", "### The loader targets, as measured in this run", ""]
    for kind in ("http", "s3"):
        at0, at20 = rate(f"{kind} Loader", 0), rate(f"{kind} Loader", 20)
        if at0 is None or at20 is None:
            continue
        fetched = row(f"{kind} Loader", 20)["x_sample_bytes"]
        lines.append(
            f"- {kind}, 20 ms: Loader {at20:,.0f} samples/s (target >= 5,000); "
            f"{at20 / at0:.2f}x the same Loader at 0 ms (target >= 0.8); fetched "
            f"{fetched}x the samples' bytes (target <= 1.5)"
        )
        ceiling = rate(f"{kind} client ceiling", 0)
        if ceiling is not None:
            rps = row(f"{kind} Loader", 0)["requests_per_s"]
            lines.append(
                f"- {kind}, 0 ms: Loader {at0:,.0f} samples/s = {at0 / ceiling:.2f}x the "
                f"client's request-rate ceiling ({ceiling:,.0f} requests/s, one sample a "
                f"request; target >= 0.7); its own {rps:,.0f} requests/s = "
                f"{rps / ceiling:.2f}x the ceiling (it needs fewer: ranges merged)"
            )
    loader, w0, w2 = (
        rate("local Loader (threads=0, default)", None),
        rate("local DataLoader (num_workers=0)", None),
        rate("local DataLoader (num_workers=2)", None),
    )
    if loader and w0 and w2:
        lines.append(
            f"- local: Loader (default, threads=0) {loader:,.0f} samples/s = {loader / w2:.2f}x "
            f"DataLoader num_workers=2 (target >= 1) and {loader / w0:.2f}x num_workers=0 "
            "(should not trail it)"
        )
    return lines


def write_loader_plot(raw: dict[str, Any], path: Path) -> bool:
    """samples/s against latency, one line per kind of row; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series: dict[str, list[tuple[int, float]]] = {}
    for r in raw["loader_rows"]:
        if r["latency_ms"] is None or "ceiling" in r["row"]:
            continue
        series.setdefault(r["row"], []).append((r["latency_ms"], r["samples_per_s"]))
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in series.items():
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, marker="o", label=name)
    for r in raw["loader_rows"]:
        if r["latency_ms"] is None:
            ax.axhline(r["samples_per_s"], linestyle=":", linewidth=1, color="grey")
    ax.axhline(5000, linestyle="--", color="red", linewidth=1, label="target: 5,000 samples/s")
    ax.set_xlabel("added latency per request (ms)")
    ax.set_ylabel("samples/s")
    ax.set_yscale("log")
    ax.set_title("12 KB samples, shuffled epoch (dotted: local rows)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
