"""The ``pickleshard`` command line: ``synth``, ``index``, ``demo``, ``bench``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import PickleshardError
from .safety import UnpicklePolicy

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int]


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be comma-separated integers, got {text!r}"
        ) from None
    if any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(f"shape dimensions must be >= 0, got {text!r}")
    return dims


def _cmd_synth(args: argparse.Namespace) -> int:
    from .synth import write_synthetic

    t0 = time.perf_counter()
    paths = write_synthetic(
        args.out,
        files=args.files,
        per_file=args.per_file,
        shape=args.shape,
        kind=args.kind,
        protocol=args.protocol,
        seed=args.seed,
    )
    size = sum(p.stat().st_size for p in paths)
    print(
        f"wrote {len(paths)} files, {len(paths) * args.per_file} samples, "
        f"{size / (1 << 20):.1f} MiB to {args.out} in {time.perf_counter() - t0:.1f} s"
    )
    return 0


def _add_safety_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("safety (unpickling runs code; only allowlisted globals load)")
    g.add_argument(
        "--trusted", action="store_true", help="load any global: only for files you trust"
    )
    g.add_argument(
        "--allow-global",
        action="append",
        default=[],
        metavar="MODULE.NAME",
        help="also allow this global (repeatable)",
    )
    g.add_argument("--encoding", default="ASCII", help="text encoding for Python 2 pickles")


def _policy(args: argparse.Namespace) -> UnpicklePolicy:
    return UnpicklePolicy.from_args(
        trusted=args.trusted, allow_globals=args.allow_global, encoding=args.encoding
    )


def _cmd_index(args: argparse.Namespace) -> int:
    from .index import build_index

    t0 = time.perf_counter()
    idx = build_index(
        args.source, index=args.index, jobs=args.jobs, progress=not args.json, policy=_policy(args)
    )
    elapsed = time.perf_counter() - t0
    summary: dict[str, Any] = {
        "index": str(idx.path),
        "files": len(idx.files),
        "samples": idx.num_samples,
        "fields": list(idx.fields),
        "layout": idx.header["layout"],
        "seconds": round(elapsed, 3),
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"indexed {summary['files']} files, {summary['samples']} samples "
            f"(fields {', '.join(summary['fields'])}; layout {', '.join(summary['layout'])}) "
            f"in {elapsed:.2f} s -> {summary['index']}"
        )
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, run_demo

    cfg = DemoConfig(
        data_dir=Path(args.dir), files=args.files, per_file=args.per_file, num_workers=args.workers
    )
    run_demo(cfg)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    repo_root = Path(__file__).resolve().parents[2]
    if (repo_root / "bench" / "__init__.py").exists() and str(repo_root) not in sys.path:
        sys.path.insert(0, str(repo_root))
    try:
        bench_main = importlib.import_module("bench.__main__").main
    except ImportError:
        print("pickleshard bench runs from a source checkout (the bench/ folder)", file=sys.stderr)
        return 2
    result: int = bench_main(args.bench_args)
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pickleshard", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("synth", help="write a synthetic dataset of (x_list, y_list) pickle files")
    s.add_argument("out", help="output directory")
    s.add_argument("--files", type=int, default=8)
    s.add_argument("--per-file", type=int, default=1000)
    s.add_argument("--shape", type=_shape, default=(3, 32, 32), help="x shape, e.g. 3,32,32")
    s.add_argument("--kind", choices=("arrays", "objects"), default="arrays")
    s.add_argument("--protocol", type=int, choices=range(6), default=5)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(handler=_cmd_synth)

    s = sub.add_parser("index", help="index a directory, glob or file of pickles")
    s.add_argument("source", help="directory, glob or pickle file")
    s.add_argument("--index", help="index directory (default: SOURCE/.pickleshard)")
    s.add_argument(
        "--jobs", type=int, default=None, help="files decoded at once (default: CPUs, max 8)"
    )
    s.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    _add_safety_flags(s)
    s.set_defaults(handler=_cmd_index)

    s = sub.add_parser("demo", help="synthesise ~200 MB, index it, train a tiny model one epoch")
    s.add_argument("--dir", default="demo-data")
    s.add_argument("--files", type=int, default=8)
    s.add_argument("--per-file", type=int, default=2000)
    s.add_argument("--workers", type=int, default=2)
    s.set_defaults(handler=_cmd_demo)

    s = sub.add_parser("bench", help="run the benchmarks (from a source checkout)", add_help=False)
    s.add_argument("bench_args", nargs=argparse.REMAINDER)
    s.set_defaults(handler=_cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except PickleshardError as exc:
        print(f"pickleshard: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
