"""``pickleshard inspect``: what is in pickle files, and which globals they would load.

Nothing is loaded: see :mod:`pickleshard.inspect.file`. Several files, directories (searched for
``*.pkl``, ``*.pickle``, ``*.pk``, ``*.p``) and globs may be given; each file is reported.

Each report says the bytes the passes examined (``read``, ``bytes_read``) and the bytes storage
delivered meanwhile (``fetched``, ``bytes_fetched``: ``read_bytes`` of ``/proc/self/io``, null
where unavailable; page-cache hits count nothing, readahead counts). ``--json`` prints
:meth:`~pickleshard.inspect.report.FileReport.to_json` of the file (plus ``bytes_fetched``) when one
file is named, else a list with one entry per file (``{"path": ..., "error": ...}`` for a file that
could not be read).

Exit status: 0; 1 when any file could not be read (it is reported on stderr and the others are
still inspected); otherwise 3 with ``--strict`` when any file references a global that is not
allowed or is dangerous (those globals are listed on stderr; none with ``--trusted``) or holds a
sample the loader would refuse. The safety options are those of every loading command
(``--allow``, ``--allow-global``, ``--trusted``): the verdicts are the ones loading would meet.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import PickleshardError
from ..inspect.file import inspect_file
from ..inspect.report import FileReport
from ..io import storage_read_bytes
from ..io.listing import resolve_source
from ..io.options import SourceOptions
from ..scan.access import fetched_since
from . import COMMANDS
from ._common import (
    add_layout_flag,
    add_safety_flags,
    allowed_globals,
    layout_words,
    storage_options,
)

EXIT_ERROR = 1
EXIT_STRICT = 3


def _files(paths: list[str], options: SourceOptions) -> tuple[list[str], bool]:
    """The files to inspect (a URL's listed with ``options``), and whether more than one was
    (or could have been) named."""
    out: list[str] = []
    for p in paths:
        if os.path.isfile(p):
            out.append(p)
        else:  # a directory or glob; a missing path raises DatasetNotFoundError
            src = resolve_source(p, options)
            out += [os.fspath(src.absolute(rel)) for rel in src.files]
    several = len(paths) > 1 or any(not os.path.isfile(p) for p in paths)
    return out, several


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def render(r: FileReport, fetched: int | None = None) -> str:
    """The human-readable report of one file; ``fetched``: the bytes storage delivered while
    it was inspected (None: not measured)."""
    lines = [
        f"{r.path}: pickle protocol {r.protocol}, {r.pickles} pickle{'s' * (r.pickles != 1)}, "
        f"{_size(r.size)}"
    ]
    if r.compression is not None:
        c = r.compression
        lines.append(
            f"  compressed {c['format']}, {_size(c['compressed_size'])} -> {_size(r.size)} "
            f"decompressed ({c['seek']}); what follows is the decompressed stream"
        )
    indexable = "span-indexable" if r.span_indexable else f"not span-indexable: {r.reason}"
    lines.append(f"  layout   {layout_words(r.layout)}")
    if r.ambiguity is not None:  # the reading chosen, and the other one as plausible
        a = r.ambiguity
        lines.append(f"  chosen   {a.chosen} (--layout {a.keep})")
        lines.append(f"  or       {a.alternative} (--layout {a.argument})")
    for k, v in r.metadata.items():
        lines.append(f"  metadata {k} = {v}")
    lines.append(f"  reading  {indexable}")
    if r.fields is not None:
        lines.append(f"  samples  {r.samples:,} per field ({', '.join(r.fields)})")
    width = max((len(f) for f in r.preview), default=0)
    for f, items in r.preview.items():
        for i, text in enumerate(items):
            head = f"{f:<{width}}" if i == 0 else " " * width
            lines.append(f"    {head}  [{i}] {text}")
    verdict = r.verdict or "none"
    lines.append(f"  globals  {len(r.globals)} (worst: {verdict})")
    gw = max((len(g.qualname) for g in r.globals), default=0)
    for g in r.globals:
        lines.append(f"    {g.verdict:<11}  {g.qualname:<{gw}}  refs {g.refs:,}  calls {g.calls:,}")
    for text in r.refusals:  # what loading refuses although the globals are allowed
        lines.append(f"  refused  {text}")
    extra = ", ".join(f"{k} {v:,}" for k, v in r.counts.items())
    if r.computed_calls:
        extra += f"{', ' if extra else ''}calls of computed values {r.computed_calls:,}"
    lines.append(f"  opcodes  {r.opcodes:,}" + (f" ({extra})" if extra else ""))
    pct = 100 * r.bytes_read / r.size if r.size else 0.0
    lines.append(
        f"  read     {_size(r.bytes_read)} ({pct:.2f}% of the file, summed over passes) "
        f"in {r.seconds:.3f} s"
    )
    if fetched is not None:  # page-cache hits are not fetched; readahead is
        pct = 100 * fetched / r.size if r.size else 0.0
        lines.append(f"  fetched  {_size(fetched)} from storage ({pct:.2f}% of the file)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    files, several = _files(args.paths, SourceOptions(storage_options(args)))
    status = 0
    out: list[dict[str, Any]] = []
    for path in files:
        before = storage_read_bytes()
        try:
            report = inspect_file(
                path,
                encoding=args.encoding,
                allow_globals=allowed_globals(args),
                samples=args.samples,
                check_all=args.strict,
                layout=args.layout,
                storage_options=storage_options(args),
            )
        except PickleshardError as exc:
            if not several:
                raise
            print(f"pickleshard: error: {exc}", file=sys.stderr)
            out.append({"path": path, "error": str(exc)})
            status = EXIT_ERROR
            continue
        fetched = fetched_since(before)
        if args.json:
            out.append({**report.to_json(), "bytes_fetched": fetched})
        else:
            head = "\n" if status or path != files[0] else ""
            print(head + render(report, fetched), flush=True)
        # --trusted loads any global: then only the loader's other refusals count
        unsafe = [] if args.trusted else report.unsafe
        if args.strict and (unsafe or report.refusals):
            names = ", ".join(f"{g.qualname} ({g.verdict})" for g in unsafe)
            what = "; ".join(([names] if names else []) + report.refusals)
            print(f"pickleshard: strict: {path}: {what}", file=sys.stderr)
            status = status or EXIT_STRICT
    if args.json:
        print(json.dumps(out if several else out[0], indent=1))
    return status


def register(sub: Any) -> None:
    s = sub.add_parser(
        "inspect",
        help=COMMANDS["inspect"],
        description=(
            "Report each pickle file's protocol, layout, fields, sample count, first samples' "
            "types, and every global it references with a verdict (allowed / not allowed / "
            "dangerous, as --allow, --allow-global and --trusted make it). Reads opcodes only: "
            "nothing in the file is imported or run."
        ),
        epilog=(
            "exit status: 0 ok; 1 a file could not be read; 3 with --strict, a global that is "
            "not allowed or is dangerous"
        ),
    )
    s.add_argument("paths", nargs="+", metavar="PATH", help="pickle file, directory or glob")
    s.add_argument("--json", action="store_true", help="print JSON (a list for several files)")
    s.add_argument(
        "--strict",
        action="store_true",
        help="exit 3 when any global is not allowed or dangerous, or a sample would be refused "
        "(an amplifying call, nesting too deep, BUILD on a global; listed on stderr); evaluates "
        "every sample inertly, so it reads all opcodes",
    )
    s.add_argument(
        "--samples", type=int, default=3, metavar="K", help="samples summarised per field"
    )
    add_safety_flags(s)  # verdicts as the loading commands would give them with these
    add_layout_flag(s)
    s.set_defaults(handler=run)


__all__ = ["EXIT_ERROR", "EXIT_STRICT", "register", "render", "run"]
