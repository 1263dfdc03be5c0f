"""Argument types and flag groups shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from ..errors import UnsupportedLayoutError
from ..executors import dask_address
from ..safety.allowlist import available_presets, parse_allow_globals, preset_names
from ..safety.policy import UnpicklePolicy
from ..scan.layouts import APPENDED, LAYOUT_CHOICE_HELP, LAYOUT_CHOICES, layout_named

__all__ = [
    "add_executor_flag",
    "add_layout_flag",
    "add_safety_flags",
    "add_storage_flags",
    "allowed_globals",
    "layout_words",
    "parse_executor",
    "parse_size",
    "policy_from_args",
    "safety_kwargs",
    "show_progress",
    "storage_options",
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


def parse_executor(text: str) -> str:
    """``local``, ``dask``, ``dask=ADDRESS`` or ``dask://HOST:PORT``, checked at parse time."""
    if text != "local":
        try:
            dask_address(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_executor_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--executor",
        type=parse_executor,
        default=None,
        metavar="local|dask[=ADDRESS]",
        help="where the per-file work runs: local processes (default), 'dask' (a local Dask "
        "cluster of --jobs workers) or 'dask=tcp://HOST:PORT' (a running scheduler; its "
        "workers must see the same paths). Needs pip install 'pickleshard[dask]'",
    )


def _global_name(text: str) -> str:
    """An ``--allow-global`` value, checked when parsed: ``module.name`` or ``module:qualname``
    (a preset's name given here is pointed to ``--allow``)."""
    try:
        parse_allow_globals([text])
    except ValueError as exc:
        hint = f"; {text!r} is a preset: --allow {text}" if text in available_presets() else ""
        raise argparse.ArgumentTypeError(f"{exc}{hint}") from None
    return text


def add_safety_flags(p: argparse.ArgumentParser) -> None:
    """The safety options every subcommand that reads pickles takes, the same everywhere:
    ``--trusted``, ``--allow-global MODULE.NAME``, ``--allow PRESET``, ``--encoding`` (and the
    storage options of the paths it reads)."""
    g = p.add_argument_group("safety (unpickling runs code; only allowlisted globals load)")
    g.add_argument(
        "--trusted", action="store_true", help="load any global: only for files you trust"
    )
    g.add_argument(
        "--allow-global",
        action="append",
        default=[],
        type=_global_name,
        metavar="MODULE.NAME",
        help="also allow this global (repeatable)",
    )
    presets = available_presets()  # read when the parser is built: registered ones included
    g.add_argument(
        "--allow",
        action="append",
        default=[],
        choices=presets,
        metavar="PRESET",
        help=f"also allow a vetted preset: {', '.join(presets)} (repeatable)",
    )
    g.add_argument(
        "--encoding", default="ASCII", help="text encoding: latin1 or bytes for Python 2 pickles"
    )
    add_storage_flags(p)


def add_storage_flags(p: argparse.ArgumentParser) -> None:
    """``--storage-option KEY=VALUE`` (repeatable): fsspec options for a URL data path."""
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        type=_storage_option,
        metavar="KEY=VALUE",
        help="an fsspec storage option for s3://, gs://, https://... data paths (repeatable; "
        "a dotted KEY nests: client_kwargs.endpoint_url=http://...; VALUE is JSON or text)",
    )


def _storage_option(text: str) -> tuple[list[str], Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text.split('=')[0]!r}...")
    try:
        parsed: Any = json.loads(value)
    except ValueError:
        parsed = value
    return key.split("."), parsed


def storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``--storage-option`` values as one (nested) mapping, which the command passes to
    what opens its URLs; None when none was given."""
    pairs = getattr(args, "storage_option", None)
    if not pairs:
        return None
    options: dict[str, Any] = {}
    for keys, value in pairs:
        node = options
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return options


def add_layout_flag(p: argparse.ArgumentParser) -> None:
    # auto, the default, is said last: the others are what it chooses among
    readings = [f"{name} ({LAYOUT_CHOICE_HELP[name]})" for name in LAYOUT_CHOICES if name != "auto"]
    p.add_argument(
        "--layout",
        choices=LAYOUT_CHOICES,
        default="auto",
        help=f"what a file or record is: {', '.join(readings)}; auto (default) "
        f"{LAYOUT_CHOICE_HELP['auto']}",
    )


# what each layout of the table looks like, to say beside the --layout choice that reads it
_SHAPES = {
    "columns": "a tuple or list of columns",
    "dict_columns": "a dict of columns",
    "rows": "a list of tuples",
    "dict_rows": "a list of dicts",
    "items": "a list, one sample per item",
    "samples": "one sample per pickle",
    "dict_samples": "one dict per pickle",
}


def layout_words(name: str) -> str:
    """A layout as files and indexes name it (``dict_rows``, ``appended_columns``), in the
    vocabulary of ``--layout``: the choice that reads it, then its shape (``records (a list of
    dicts)``); a name the table does not know, as it is."""
    try:
        layout = layout_named(name, "")
    except UnsupportedLayoutError:
        return name
    appended = name.startswith(APPENDED)
    shape = _SHAPES.get(layout.name, layout.name)
    if not layout.per_sample:
        choice = "columns"
    elif layout.per_pickle and not appended:
        choice, shape = "file", "the file's one pickle is the sample"
    elif appended and not layout.per_pickle:  # chunks of rows: only auto reads those
        choice = "auto"
    else:
        choice = "records"
    if appended and not layout.per_pickle:
        shape = f"appended pickles, each {shape}"
    return f"{choice} ({shape})"


def policy_from_args(args: argparse.Namespace) -> UnpicklePolicy:
    return UnpicklePolicy.from_args(
        trusted=args.trusted, allow_globals=allowed_globals(args), encoding=args.encoding
    )


def allowed_globals(args: argparse.Namespace) -> list[str]:
    """``--allow-global`` names and the globals of the ``--allow`` presets."""
    return [*args.allow_global, *preset_names(getattr(args, "allow", []))]


def safety_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """The ``trusted``/``allow_globals``/``encoding`` keywords of the Python API."""
    return {
        "trusted": args.trusted,
        "allow_globals": allowed_globals(args),
        "encoding": args.encoding,
    }


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars only for a person watching: not with ``--json``, not when stderr is a
    file or a pipe (where a bar's redraws would bury the one-line error)."""
    return not args.json and sys.stderr.isatty()
