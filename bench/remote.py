"""``python -m bench remote``: a dataset on S3 (moto's server on 127.0.0.1) read by byte range.

One synthetic dataset in the seed layout (float32 ``(3, 112, 112)`` arrays: 150 KB samples) is
written locally and uploaded to a moto S3 server started here, whose WSGI app counts the body
bytes it sends. In one run, each row a shuffled epoch (one permutation, batches of
``--batch-size`` through a ``DataLoader`` with ``num_workers=0``), every sample checked against
``pickle.load`` of the local files:

- ``local``: :class:`~pickleshard.PickleDataset` over the local files (page cache warm);
- ``s3``: the same dataset at ``s3://bench/data/`` (index built first: its time and bytes are
  reported too), no block cache;
- ``s3 + block cache``: one dataset with a block cache (``block_cache_bytes``, ``--cache-mib``;
  ``--block-kib`` blocks), two epochs: the first fetches blocks, the second is served from the
  cache where it fits;
- ``litdata``: LitData's ``StreamingDataset`` over the same bucket after its ``optimize``, when
  ``import litdata`` works (``--litdata-path`` is put on ``sys.path`` first); else the row says
  why.

moto reads a whole object for every ranged GET, so its rates fall with object size and say
little about S3 itself; the bytes moved are exact, the rates are ratios on this machine.

``--latency-ms 0,20,50`` adds the index rows (:mod:`bench.remote_index`): indexing a dense
(12 KB samples) and a sparse (150 KB) dataset over the range server and moto's S3, each in its
own process adding that latency to every request, against downloading the files whole;
``--skip-epoch`` leaves the epoch rows above out. With ``--latency-ms`` the loader rows
(:mod:`bench.remote_loader`) come too: a shuffled epoch of 12 KB arrays local, remote through
``DataLoader`` and :class:`pickleshard.Loader`, and downloaded first, with a plot of samples/s
against latency (``--skip-loader`` leaves them out, ``--skip-index`` the index rows).
"""

from __future__ import annotations

import argparse
import os
import pickle
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pickleshard import PickleDataset, build_index
from pickleshard.io import SourceOptions
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.testing.servers import S3Server

from .remote_index import index_lines, measure_index
from .remote_loader import loader_lines, measure_loader, write_loader_plot
from .report import describe_machine, report_head, save_results

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
MB = 1e6


def _oracle(paths: list[Path]) -> list[tuple[Any, Any]]:
    out: list[tuple[Any, Any]] = []
    for p in paths:
        with open(p, "rb") as fh:
            xs, ys = pickle.load(fh)
        out += list(zip(xs, ys, strict=True))
    return out


def _epoch(ds: Any, order: list[int], batch: int, oracle: list[tuple[Any, Any]]) -> float:
    """Seconds for one epoch over ``order`` through a DataLoader; every sample checked."""
    import torch

    loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=order, num_workers=0)
    k = 0
    t0 = time.perf_counter()
    for xs, ys in loader:
        for x, y in zip(xs, ys, strict=True):
            want = oracle[order[k]]
            if not (np.array_equal(x.numpy(), want[0]) and int(y) == want[1]):
                raise AssertionError(f"sample {order[k]} differs from pickle.load")
            k += 1
    if k != len(order):
        raise AssertionError(f"{k} samples read, {len(order)} asked")
    return time.perf_counter() - t0


def _row(
    name: str, seconds: float, n: int, sent: int | None, gets: int | None, total: int
) -> dict[str, Any]:
    return {
        "row": name,
        "seconds": round(seconds, 3),
        "samples_per_s": round(n / seconds, 1),
        "bytes_moved": sent,
        "x_dataset": None if sent is None else round(sent / total, 3),
        "requests": gets,
    }


def _litdata_samples(item: tuple[str, int]) -> Any:
    """LitData's ``optimize`` input function: the samples of one pickle file, each with its
    global index ``i`` (so that the epoch checks it against ``pickle.load``)."""
    path, first = item
    with open(path, "rb") as fh:
        xs, ys = pickle.load(fh)
    for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
        yield {"i": first + k, "x": x, "y": int(y)}


def _litdata(
    args: argparse.Namespace,
    s3: S3Server,
    paths: list[Path],
    order: list[int],
    oracle: list[tuple[Any, Any]],
    total: int,
) -> dict[str, Any]:
    """LitData's StreamingDataset on the bucket after its optimize, or the reason it is not."""
    if args.litdata_path:
        sys.path.insert(0, args.litdata_path)
    try:
        import litdata
    except Exception as exc:  # not installed, or its imports fail
        return {"row": "litdata", "reason": f"import litdata failed: {type(exc).__name__}: {exc}"}
    try:
        out = Path(tempfile.mkdtemp(prefix="bench-litdata-"))
        inputs = [(str(p), f * args.per_file) for f, p in enumerate(paths)]
        t0 = time.perf_counter()
        litdata.optimize(
            fn=_litdata_samples,
            inputs=inputs,
            output_dir=str(out),
            chunk_bytes="16MB",
            num_workers=1,
        )
        optimize_s = time.perf_counter() - t0
        s3.upload(
            "bench", {f"litdata/{p.name}": p.read_bytes() for p in out.iterdir() if p.is_file()}
        )
        from litdata.streaming import downloader

        # obstore (litdata's default downloader) refuses a plain-http endpoint unless told
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
        os.environ["AWS_ENDPOINT_URL"] = s3.endpoint
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        s3.traffic.reset()
        ds = litdata.StreamingDataset(
            "s3://bench/litdata",
            shuffle=True,
            storage_options={
                "endpoint_url": s3.endpoint,
                "aws_access_key_id": "testing",
                "aws_secret_access_key": "testing",
            },
        )
        import torch

        loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, num_workers=0)
        t0 = time.perf_counter()
        seen = []
        for batch in loader:  # the same per-sample check as the other rows
            for i, x, y in zip(batch["i"].tolist(), batch["x"], batch["y"], strict=True):
                want = oracle[i]
                if not (np.array_equal(x.numpy(), want[0]) and int(y) == want[1]):
                    raise AssertionError(f"litdata sample {i} differs from pickle.load")
                seen.append(i)
        seconds = time.perf_counter() - t0
        n = len(seen)
        if sorted(seen) != list(range(len(oracle))):
            raise AssertionError("litdata's epoch lost or repeated samples")
        row = _row(
            "litdata StreamingDataset (shuffle=True)",
            seconds,
            n,
            s3.traffic.sent,
            s3.traffic.gets,
            total,
        )
        row["note"] = (
            f"optimize {optimize_s:.1f} s (not in the epoch); whole chunks (16 MB) downloaded "
            "to a local cache"
        )
        return row
    except Exception as exc:
        return {"row": "litdata", "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch.utils.data  # noqa: F401 - imported before any row is timed

    work = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    os.environ["PICKLESHARD_INDEX_HOME"] = str(work / "indexes")
    paths = write_synthetic(
        work / "data", files=args.files, per_file=args.per_file, shape=(3, 112, 112)
    )
    total = sum(p.stat().st_size for p in paths)
    oracle = _oracle(paths)
    order = np.random.default_rng(0).permutation(len(oracle)).tolist()
    s3 = S3Server().start()
    rows: list[dict[str, Any]] = []
    try:
        s3.upload("bench", {f"data/{p.name}": p.read_bytes() for p in paths})
        options = s3.options()  # passed to each dataset and build: nothing process-wide
        t0 = time.perf_counter()
        build_index(work / "data", jobs=1)
        local_index_s = time.perf_counter() - t0
        s3.traffic.reset()
        t0 = time.perf_counter()
        build_index("s3://bench/data/", jobs=1, storage_options=options)
        rows.append(
            _row(
                "index s3 (jobs=1)",
                time.perf_counter() - t0,
                len(oracle),
                s3.traffic.sent,
                s3.traffic.gets,
                total,
            )
        )
        rows.append(_row("index local (jobs=1)", local_index_s, len(oracle), None, None, total))
        local = PickleDataset(work / "data")
        rows.append(
            _row(
                "local files",
                _epoch(local, order, args.batch_size, oracle),
                len(order),
                None,
                None,
                total,
            )
        )
        remote = PickleDataset("s3://bench/data/", storage_options=options)
        s3.traffic.reset()
        seconds = _epoch(remote, order, args.batch_size, oracle)
        rows.append(
            _row("s3, no cache", seconds, len(order), s3.traffic.sent, s3.traffic.gets, total)
        )
        cached = PickleDataset(
            "s3://bench/data/",
            storage_options=SourceOptions(
                options, block_cache_bytes=args.cache_mib << 20, block_size=args.block_kib << 10
            ),
        )
        cache = cached.source_options.block_cache
        assert cache is not None
        for epoch in (1, 2):
            s3.traffic.reset()
            seconds = _epoch(cached, order, args.batch_size, oracle)
            row = _row(
                f"s3, block cache {args.cache_mib} MiB, epoch {epoch}",
                seconds,
                len(order),
                s3.traffic.sent,
                s3.traffic.gets,
                total,
            )
            row["cache_held_mib"] = round(cache.held / 2**20, 1)
            rows.append(row)
        rows.append(_litdata(args, s3, paths, order, oracle, total))
    finally:
        s3.stop()
    return {"dataset_bytes": total, "samples": len(oracle), "rows": rows}


def _lines(raw: dict[str, Any], machine: dict[str, str]) -> list[str]:
    lines = report_head(
        "Remote data: a shuffled epoch from S3 (moto on 127.0.0.1) by byte range", machine
    )
    if "index_rows" in raw:
        lines += index_lines(raw)
    if "loader_rows" in raw:
        lines += loader_lines(raw)
    if "rows" not in raw:
        return lines
    lines += [
        "",
        f"Dataset: {raw['samples']} float32 (3, 112, 112) samples (150 KB), "
        f"{raw['dataset_bytes'] / MB:.1f} MB in the seed layout; every sample checked against "
        "pickle.load. Bytes moved: response bodies counted by the server.",
        "",
        "| row | seconds | samples/s | bytes moved | x dataset | ranged GETs | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in raw["rows"]:
        if "reason" in r:
            lines.append(f"| {r['row']} | - | - | - | - | - | not run: {r['reason']} |")
            continue
        moved = "-" if r["bytes_moved"] is None else f"{r['bytes_moved'] / MB:.2f} MB"
        x = "-" if r["x_dataset"] is None else f"{r['x_dataset']:.3f}"
        note = r.get("note", "")
        if "cache_held_mib" in r:
            note = f"cache holds {r['cache_held_mib']} MiB"
        lines.append(
            f"| {r['row']} | {r['seconds']} | {r['samples_per_s']} | {moved} | {x} | "
            f"{r['requests'] if r['requests'] is not None else '-'} | {note} |"
        )
    lines += [
        "",
        "moto reads the whole object for each ranged GET: its per-request cost grows with the "
        "object, so the s3 rates are a floor set by moto; the byte counts are exact.",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench remote", description=__doc__, allow_abbrev=False
    )
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--per-file", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--cache-mib", type=int, default=256, help="block cache budget")
    p.add_argument("--block-kib", type=int, default=1024, help="block cache block size")
    p.add_argument("--litdata-path", default="", help="a folder to import litdata from")
    p.add_argument(
        "--latency-ms",
        default="",
        help="comma-separated latencies added per request: adds the index rows",
    )
    p.add_argument("--servers", default="http,s3", help="index rows: http, s3 or both")
    p.add_argument("--repeats", type=int, default=2, help="index rows: runs per row (best)")
    p.add_argument("--skip-epoch", action="store_true", help="leave the 150 KB S3 epoch rows out")
    p.add_argument("--skip-index", action="store_true", help="leave the index rows out")
    p.add_argument("--skip-loader", action="store_true", help="leave the loader rows out")
    p.add_argument("--prefetch", type=int, default=16, help="loader rows: batches in flight")
    p.add_argument("--dl-samples", type=int, default=2000, help="remote DataLoader rows: samples")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--name", default="remote-s3")
    args = p.parse_args(argv)
    command = shlex.join(
        ["python", "-m", "bench", "remote", *(sys.argv[2:] if argv is None else argv)]
    )
    machine = describe_machine(command)
    raw: dict[str, Any] = {}
    if args.latency_ms:
        latencies = [int(v) for v in args.latency_ms.split(",") if v.strip()]
        servers = [s.strip() for s in args.servers.split(",") if s.strip()]
        if not args.skip_index:
            raw.update(measure_index(latencies, servers, args.repeats))
        if not args.skip_loader:
            raw.update(
                measure_loader(
                    latencies, servers, prefetch=args.prefetch, dl_samples=args.dl_samples
                )
            )
    if not args.skip_epoch:
        raw.update(_measure(args))
    raw["machine"] = machine
    save_results(args.out, args.name, _lines(raw, machine), raw)
    if "loader_rows" in raw and write_loader_plot(raw, args.out / f"{args.name}.png"):
        print(f"plot: {args.out / f'{args.name}.png'}")
    return 0
