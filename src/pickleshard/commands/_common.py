"""Argument types and flag groups shared by several subcommands."""

from __future__ import annotations

import argparse
import re
import sys

from ..safety import UnpicklePolicy

__all__ = [
    "add_layout_flag",
    "add_safety_flags",
    "parse_size",
    "policy_from_args",
    "safety_kwargs",
    "show_progress",
]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """``"256M"``/``"256MB"`` -> 256,000,000; ``"1GiB"`` -> 2**30; a bare number is bytes."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"expected a size such as 512M, 4GiB or 1000000, got {text!r}"
        )
    value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return value


def add_safety_flags(p: argparse.ArgumentParser) -> None:
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


def add_layout_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--layout",
        choices=("auto", "columns", "records", "file"),
        default="auto",
        help="what a file or record is: columns ((x_list, y_list), a dict of columns), records "
        "(each appended pickle, or each item of a top-level list, is one sample), file (one "
        "sample per file); auto (default) infers it and warns when another reading is as "
        "plausible",
    )


def policy_from_args(args: argparse.Namespace) -> UnpicklePolicy:
    return UnpicklePolicy.from_args(
        trusted=args.trusted, allow_globals=args.allow_global, encoding=args.encoding
    )


def safety_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """The ``trusted``/``allow_globals``/``encoding`` keywords of the Python API."""
    return {
        "trusted": args.trusted,
        "allow_globals": list(args.allow_global),
        "encoding": args.encoding,
    }


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars only for a person watching: not with ``--json``, not when stderr is a
    file or a pipe (where a bar's redraws would bury the one-line error)."""
    return not args.json and sys.stderr.isatty()
