"""``python -m bench compressed``: compressed pickles read in place, against the plain file.

Writes (once, under ``--data``) one seed-layout file, ``pickle.dump((x_list, y_list))`` of
``--samples`` uint8 images ``(32, 32, 3)`` (smooth gradients plus noise: they compress 2-4x,
as real images do) and int labels, then the same bytes compressed each way pickleshard reads:
gzip, bz2, multi-block xz (1 MiB blocks), single-block xz, seekable zstd (1 MiB frames) and
plain zstd, each in its own folder. For each, in one run:

- *index*: ``PickleDataset(folder)`` with no index and no seek points (both deleted first):
  the scan, plus the first decoding pass that builds the seek points (gzip, bz2) or the
  decompressed copy (single-block xz, plain zstd);
- *reopen*: ``PickleDataset(folder, rebuild="never")`` and one read: the staleness check and
  loading the seek points (or finding the copy);
- *random reads*: ``ds[i]`` for ``--reads`` indices in a random order, one at a time, in this
  process: samples/s and the ratio to the plain file; once with the decoded-unit cache at its
  default budget (the whole file fits), once (``--reads`` / 10 reads) with its budget cut to
  1/8 of the decompressed file, as when the file is 8x the cache (gzip keeps rapidgzip's own chunk cache, which this
  does not bound; the plain file keeps the page cache).

Writes ``bench/results/compressed.md`` and ``.json``; never asserts a speed.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import lzma
import pickle
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pickleshard import PickleDataset
from pickleshard.io import open_source
from pickleshard.io.compressed.kinds import multiblock_xz, seekable_zstd
from pickleshard.io.compressed.units import unit_cache

from .report import describe_machine, report_head, save_results

__all__ = ["main"]

HERE = Path(__file__).resolve().parent


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(data)


FORMS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "plain": (".pkl", lambda d: d),
    "gzip": (".pkl.gz", lambda d: gzip.compress(d, compresslevel=6, mtime=0)),
    "bz2": (".pkl.bz2", bz2.compress),
    "xz multi-block": (".pkl.xz", lambda d: multiblock_xz(d, 1 << 20)),
    "xz single-block": (".pkl.xz", lambda d: lzma.compress(d, preset=6)),
    "zstd seekable": (".pkl.zst", lambda d: seekable_zstd(d, 1 << 20)),
    "zstd plain": (".pkl.zst", _zstd),
}


def _raw(samples: int) -> bytes:
    rng = np.random.default_rng(14)
    ramp = np.add.outer(np.arange(32), np.arange(32)).astype(np.int16)[..., None] * 3
    xs = [
        np.clip(ramp + rng.integers(0, 24, (32, 32, 3)) + k % 50, 0, 255).astype(np.uint8)
        for k in range(samples)
    ]
    ys = [k % 10 for k in range(samples)]
    return pickle.dumps((xs, ys), protocol=5)


def _write(data: Path, samples: int) -> dict[str, Path]:
    raw: bytes | None = None
    folders = {}
    for form, (suffix, compress) in FORMS.items():
        folder = data / f"n{samples}" / form.replace(" ", "-")
        path = folder / f"seed{suffix}"
        if not path.exists():
            raw = _raw(samples) if raw is None else raw
            folder.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(compress(raw))
            tmp.rename(path)
            print(f"wrote {path} in {time.perf_counter() - t0:.1f} s", flush=True)
        folders[form] = folder
    return folders


def _measure(folder: Path, reads: int) -> dict[str, Any]:
    shutil.rmtree(folder / ".pickleshard", ignore_errors=True)  # index and seek points
    (path,) = [p for p in folder.iterdir() if p.is_file()]
    t0 = time.perf_counter()
    ds = PickleDataset(folder, jobs=1)
    index_s = time.perf_counter() - t0
    mode = ds.index.files[0].mode
    source = open_source(path)
    how = f"{mode}, {getattr(source, 'how', 'pread')}"
    source.close()
    del ds
    t0 = time.perf_counter()
    ds = PickleDataset(folder, rebuild="never")
    ds[0]
    reopen_s = time.perf_counter() - t0
    rates = []
    cache = unit_cache()
    small = max(1, ds.index.files[0].size // 8)
    for seed, budget, n in ((0, cache.budget, reads), (1, small, max(1, reads // 10))):
        cache.clear()
        cache.budget, kept = budget, cache.budget
        order = np.random.default_rng(seed).permutation(len(ds))[:n].tolist()
        t0 = time.perf_counter()
        for i in order:
            ds[i]
        rates.append(len(order) / (time.perf_counter() - t0))
        cache.budget = kept
    return {
        "file_bytes": path.stat().st_size,
        "samples": len(ds),
        "mode": mode,
        "how": how,
        "index_s": index_s,
        "reopen_s": reopen_s,
        "reads": reads,
        "samples_per_s": rates[0],
        "samples_per_s_small_cache": rates[1],
    }


def _table(rows: dict[str, dict[str, Any]]) -> list[str]:
    plain = rows["plain"]
    lines = [
        "| file | size | read as | index (s) | reopen (s) | random reads/s | vs plain "
        "| reads/s, cache 1/8 of the file | vs plain |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for form, r in rows.items():
        lines.append(
            f"| {form} | {r['file_bytes'] / 2**20:.1f} MiB | {r['how']} | {r['index_s']:.2f} "
            f"| {r['reopen_s']:.3f} | {r['samples_per_s']:,.0f} "
            f"| {r['samples_per_s'] / plain['samples_per_s']:.2f}x "
            f"| {r['samples_per_s_small_cache']:,.0f} "
            f"| {r['samples_per_s_small_cache'] / plain['samples_per_s_small_cache']:.2f}x |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench compressed", description=__doc__, allow_abbrev=False
    )
    p.add_argument("--samples", type=int, default=8000, help="images in the file")
    p.add_argument("--reads", type=int, default=2000, help="random ds[i] reads timed")
    p.add_argument("--data", type=Path, default=HERE / "data" / "compressed")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--name", default="compressed")
    args = p.parse_args(argv)
    command = shlex.join(["python", "-m", "bench", "compressed", *(argv or [])])
    machine = describe_machine(command)
    folders = _write(args.data, args.samples)
    rows: dict[str, dict[str, Any]] = {}
    for form, folder in folders.items():
        rows[form] = r = _measure(folder, args.reads)
        print(
            f"-- {form}: index {r['index_s']:.2f} s, reopen {r['reopen_s']:.3f} s, "
            f"{r['samples_per_s']:,.0f} random reads/s",
            flush=True,
        )
    setup = (
        f"One file of {args.samples:,} uint8 (32, 32, 3) images and int labels "
        f"(`pickle.dump((x_list, y_list))`, protocol 5, {rows['plain']['file_bytes'] / 2**20:.1f}"
        f" MiB), compressed each way; {args.reads:,} `ds[i]` in a random order in one process, "
        "from the page cache. *index*: no index, no seek points; *reopen*: index and seek points "
        "kept, one read."
    )
    lines = [
        *report_head("Compressed pickles read in place (issue 14)", machine),
        "",
        "## Setup",
        "",
        setup,
        "",
        "## Results",
        "",
        *_table(rows),
        "",
    ]
    save_results(args.out, args.name, lines, {"machine": machine, "setup": setup, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
