"""``pickleshard bench [ARGS...]``: run ``python -m bench ARGS...`` from a source checkout.

Everything after ``bench`` goes to the benchmark's own parser unchanged (``pickleshard bench
--help`` shows its options), so :func:`pickleshard.cli.main` hands it over before parsing.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import COMMANDS


def run_bench(argv: Sequence[str]) -> int:
    repo_root = Path(__file__).resolve().parents[3]
    if (repo_root / "bench" / "__init__.py").exists() and str(repo_root) not in sys.path:
        sys.path.insert(0, str(repo_root))
    try:
        bench_main = importlib.import_module("bench.__main__").main
    except ImportError:
        print("pickleshard bench runs from a source checkout (the bench/ folder)", file=sys.stderr)
        return 2
    result: int = bench_main(list(argv))
    return result


def register(sub: Any) -> None:
    # Listed for --help only: main() dispatches "bench ..." before argparse sees it.
    sub.add_parser("bench", help=COMMANDS["bench"])
