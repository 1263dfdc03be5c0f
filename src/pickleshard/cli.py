"""The ``pickleshard`` command line; each subcommand lives in :mod:`pickleshard.commands`.

Every failure ends in one line on stderr, ``pickleshard: error: <file>: <what>``, and a nonzero
exit status: 1 for an error, 130 when interrupted (Ctrl-C). A traceback is a bug; ``--debug``
shows the traceback of an unexpected error instead of the line (a flag, not an environment
variable: no module of the package reads the environment).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .commands import COMMANDS
from .commands.bench import run_bench
from .errors import PickleshardError

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "main"]

Handler = Callable[[argparse.Namespace], int]

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
_SPACE = (errno.ENOSPC, errno.EDQUOT)
_RESUMABLE = ("convert", "split")  # commands whose rerun picks up where they stopped


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


class _Parser(argparse.ArgumentParser):
    """A parser that takes no abbreviation of an option (``--allow`` is never ``--allow-global``
    cut short): the subcommands' parsers are of this class too, as argparse makes them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def _parser(command: str | None) -> argparse.ArgumentParser:
    p = _Parser(
        prog="pickleshard",
        description="Train on folders of pickle files without loading them whole.",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of an unexpected error",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, summary in COMMANDS.items():
        if name == command:  # the command that runs: its module, imported by its name
            importlib.import_module(f".commands.{name}", __package__).register(sub)
        else:
            sub.add_parser(name, help=summary)
    return p


def _subject(args: argparse.Namespace | None) -> str:
    """The path a command works on, to name in an error that does not name one itself."""
    for name in ("source", "path", "paths", "dataset", "out"):
        value = getattr(args, name, None)
        if isinstance(value, list):  # verify [SRC] OUT: the output is what it checks
            value = value[-1] if value else None
        if isinstance(value, str) and value:
            return value
    return getattr(args, "command", None) or "pickleshard"


def _describe(exc: BaseException, subject: str) -> str:
    """``<file>: <what>`` for an exception that is not a :class:`PickleshardError`."""
    if isinstance(exc, KeyboardInterrupt):
        return f"{subject}: interrupted"
    if isinstance(exc, OSError):
        where = os.fspath(exc.filename) if exc.filename is not None else subject
        what = exc.strerror or str(exc) or type(exc).__name__
        if exc.errno in _SPACE:
            what += "; free space and rerun the same command"
        return f"{where}: {what[:1].lower()}{what[1:]}"
    if isinstance(exc, MemoryError):
        detail = f" ({exc})" if str(exc) else ""
        return f"{subject}: out of memory{detail}; a sample or file needs more than is available"
    if isinstance(exc, BrokenProcessPool):
        return (
            f"{subject}: a worker process died (killed, or out of memory?); rerun with --jobs 1 "
            "to see what failed"
        )
    if isinstance(exc, RecursionError):
        return f"{subject}: data nested too deeply for Python's recursion limit ({exc})"
    return (
        f"{subject}: internal error: {type(exc).__name__}: {exc} "
        "(a bug: rerun with --debug for the traceback, and report it)"
    )


def _error(text: str) -> None:
    # one line whatever the message holds: a path or a repr may carry a newline
    line = " ".join(text.split("\n"))
    print(f"pickleshard: error: {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args: argparse.Namespace | None = None
    debug = False
    try:
        if argv[:1] == ["bench"]:
            return run_bench(argv[1:])
        args = _parser(_command(argv)).parse_args(argv)
        debug = args.debug
        handler: Handler = args.handler
        return handler(args)
    except PickleshardError as exc:
        _error(str(exc))
        return EXIT_ERROR
    except KeyboardInterrupt as exc:
        if getattr(args, "command", None) in _RESUMABLE:
            _error(f"{args.out}: interrupted; rerun the same command to resume")  # type: ignore[union-attr]
        else:
            _error(_describe(exc, _subject(args)))
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader of stdout went away (``| head``): not an error; silence the flush at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as exc:  # MemoryError and RecursionError included
        if debug:
            raise
        _error(_describe(exc, _subject(args)))
        return EXIT_ERROR
