"""The ``pickleshard`` command line; each subcommand lives in :mod:`pickleshard.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from .commands import COMMANDS
from .errors import PickleshardError

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pickleshard",
        description="Train on folders of pickle files without loading them whole.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f".commands.{name}", __package__).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["bench"]:
            from .commands.bench import run_bench

            return run_bench(argv[1:])
        args = _parser().parse_args(argv)
        handler: Handler = args.handler
        return handler(args)
    except PickleshardError as exc:
        print(f"pickleshard: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
