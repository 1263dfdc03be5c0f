"""Building an index: every file described (in parallel, through an executor), fields matched,
the arrays and header written, and the result opened.

Building keeps at most one file's span arrays in a worker's memory: workers save them to a
staging folder inside the index directory, and the parent copies them into the final arrays
through a memory map (:mod:`pickleshard.indexing.write`). Where the per-file work runs is the
executor's business (:mod:`pickleshard.executors.local`): local processes by default.
"""

from __future__ import annotations

import copy
import os
import secrets
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..errors import (
    CorruptPickleError,
    EmptyPickleError,
    FileProblem,
    NotAPickleError,
    TruncatedPickleError,
    UnsupportedLayoutError,
)
from ..executors import ExecutorLike, IndexExecutor, InlineExecutor, resolve_executor
from ..index.files import SkippedFile, skip_record
from ..index.model import DatasetIndex
from ..index.ondisk import default_index_path
from ..io.listing import ResolvedSource, Source, resolve_source
from ..io.options import SourceOptions, source_options
from ..io.remote.source import is_url
from ..safety.policy import DEFAULT_POLICY, UnpicklePolicy
from ..scan.ahead import ScanAhead
from ..scan.layouts import LayoutChoice, check_layout_choice
from ..scan.scratch import scratch_scope
from .describe import Described, describe_file
from .openaudit import remember_globals
from .write import write_index

__all__ = ["INLINE_FILES", "REMOTE_FILES_AT_ONCE", "build_index"]

INLINE_FILES = 16
"""Up to this many files are indexed in this process, one after another, unless an executor is
named: the compiled scan holds the GIL (threads take turns), and a process pool's start, task
pickling and staged arrays cost more than a few files' scans (measured with ``python -m bench
open --executors``: inline is fastest up to 32 files on a loaded 2-core machine, 2 threads
1.1-1.6x and 2 processes 1.4-2.7x slower; see :mod:`pickleshard.executors.local`)."""

REMOTE_FILES_AT_ONCE = 4
"""Files under a URL indexed in this process are described this many at once, in threads: their
fetches wait on round trips and downloads (GIL released) that overlap where one after another
they add (``python -m bench remote``; their downloads share one budget of bytes in flight)."""


def describe_or_problem(
    root: str,
    rel: str,
    pos: int,
    staging: Path | None,
    policy: UnpicklePolicy,
    layout: LayoutChoice = "auto",
    options: SourceOptions | None = None,
    in_memory: bool = False,
) -> Described | FileProblem:
    """:func:`~pickleshard.indexing.describe.describe_file`, with the error that names a bad file
    returned rather than raised (so that an executor hands it back like any result)."""
    try:
        return describe_file(root, rel, pos, staging, policy, layout, options, in_memory)
    except FileProblem as exc:
        return exc


# a file cut short, empty or not a pickle: leaving it out (skip_bad) is the usual fix
_DAMAGED = (TruncatedPickleError, EmptyPickleError, NotAPickleError)


def _describe_all(
    source: ResolvedSource,
    staging: Path | None,
    executor: IndexExecutor,
    progress: bool,
    policy: UnpicklePolicy,
    skip_bad: bool,
    layout: LayoutChoice,
) -> Iterator[tuple[int, Described | FileProblem]]:
    """``(position, described)`` for every file, in completion order; with ``skip_bad`` a bad
    file yields its error instead of raising it."""
    root = os.fspath(source.root)
    # each task carries the source's options: a worker (a process, a Dask task) opens with them
    opts = source.options
    # described in this process: the span arrays stay in memory for the write (no staging)
    here = isinstance(executor, InlineExecutor)
    tasks = [
        (root, rel, pos, staging, policy, layout, opts, here)
        for pos, rel in enumerate(source.files)
    ]
    # no bar at all unless asked: a disabled tqdm still makes its multiprocessing lock (an
    # import and a semaphore in a process's first build)
    with tqdm(total=len(tasks), unit="file", desc="index") if progress else nullcontext() as bar:
        results = executor.run(describe_or_problem, tasks)
        try:
            for pos, got in results:
                if isinstance(got, FileProblem) and not skip_bad:
                    raise _damaged(got)
                yield pos, got
                if bar is not None:
                    bar.update()
        finally:  # stopped early (an error here or in the caller): the executor cancels
            results.close()


def _damaged(exc: FileProblem) -> FileProblem:
    """``exc``, saying how to index the other files when it is a damaged file's."""
    if isinstance(exc, _DAMAGED) or type(exc) is CorruptPickleError:
        out = copy.copy(exc)  # the same error, its message ending with the fix
        fix = "pass skip_bad=True (pickleshard index --skip-bad) to index the other files and "
        out.args = (f"{exc.args[0]}; {fix}list this one, or replace it", *exc.args[1:])
        return out
    return exc


def _check_fields(
    described: dict[int, Described], source: ResolvedSource, skip_bad: bool
) -> tuple[list[Described], list[SkippedFile]]:
    """The files (in files-table order) whose fields match those of the first file, or with
    ``skip_bad`` those of most files; the others are skipped with ``skip_bad``, else the first
    of them raises."""
    ordered = [described[p] for p in sorted(described)]
    if not ordered:
        return [], []
    first = ordered[0].entry
    if skip_bad:
        common = Counter(d.entry.fields for d in ordered).most_common(1)[0][0]
        first = next(d.entry for d in ordered if d.entry.fields == common)
    kept, skipped = [], []
    for d in ordered:
        if d.entry.fields == first.fields:
            kept.append(d)
            continue
        err = UnsupportedLayoutError(
            source.absolute(d.entry.path),
            f"fields {list(d.entry.fields)} differ from {list(first.fields)} in {first.path}; "
            "every file of a dataset must have the same fields",
        )
        if not skip_bad:
            raise err
        skipped.append(skip_record(source.absolute(d.entry.path), d.entry.path, err))
    return kept, skipped


def _staging_dir(index_dir: Path) -> Path:
    """Where workers save span arrays: inside the index directory (same file system as the
    final arrays), or a temporary folder when it cannot be created (the bad files are then
    still reported before the index directory's own error)."""
    try:
        index_dir.mkdir(parents=True, exist_ok=True)
        staging = index_dir / f".staging-{secrets.token_hex(4)}"
        staging.mkdir()
    except OSError:
        return Path(tempfile.mkdtemp(prefix="pickleshard-staging-"))
    return staging


def build_index(
    source: Source,
    *,
    index: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    progress: bool = False,
    policy: UnpicklePolicy = DEFAULT_POLICY,
    spans: bool = True,
    skip_bad: bool = False,
    executor: ExecutorLike = None,
    layout: LayoutChoice = "auto",
    storage_options: Mapping[str, Any] | SourceOptions | None = None,
) -> DatasetIndex:
    """Index every pickle file of ``source`` and save the index; return it opened.

    ``storage_options`` (a URL's: credentials, endpoint... as in pandas; or the
    :class:`~pickleshard.io.SourceOptions` of a caller) list and open its objects; they go to
    the executor's workers with each task and are never written to the index.

    ``layout`` says what a file or record is (:data:`pickleshard.scan.layouts.LAYOUT_CHOICES`;
    ``"auto"`` infers it and records in the files table where another reading is as
    plausible); the index records it, and is stale for another.

    ``index`` is the index directory (default: see :func:`default_index_path`). Up to
    :data:`INLINE_FILES` files are indexed in this process; more, at most ``jobs`` at once, each
    in its own process (default: the number of CPUs, at most 8).
    Each file is scanned for its sample spans without unpickling it, and up to 32 of its samples
    are read by span to size its object fields (``spans=False``: every file
    is unpickled whole to count its samples, the pre-span behaviour); a file the scanner refuses
    is unpickled whole and recorded as such, with the reason. ``policy`` says which globals may
    load while files are unpickled (default: the allowlist) and the text encoding.

    Raises the :class:`~pickleshard.errors.PickleshardError` of the first bad file found; with
    ``skip_bad=True`` every good file is indexed and each bad one is listed in
    :attr:`DatasetIndex.skipped` with its error (nothing is dropped silently).

    ``executor`` runs the per-file work (see :func:`~pickleshard.executors.choose.resolve_executor`:
    ``"dask"``, ``"dask://HOST:PORT"``, a ``distributed.Client``...); by default local
    processes, ``jobs`` of them.
    """
    layout = check_layout_choice(layout)
    resolved = resolve_source(source, source_options(storage_options))
    index_dir = Path(index) if index is not None else default_index_path(resolved)
    n_jobs = jobs if jobs is not None else min(os.cpu_count() or 1, 8)
    small = executor is None and len(resolved.files) <= INLINE_FILES
    threads = REMOTE_FILES_AT_ONCE if is_url(os.fspath(resolved.root)) else 1
    runner = (
        InlineExecutor(threads)
        if small
        else resolve_executor(executor, n_jobs, len(resolved.files))
    )
    staging = _staging_dir(index_dir.absolute()) if spans else None  # workers' cwd may differ
    try:
        described: dict[int, Described] = {}
        skipped: list[SkippedFile] = []
        described_all = _describe_all(resolved, staging, runner, progress, policy, skip_bad, layout)
        # files scanned in this thread read into one reused buffer (pickleshard.scan.scratch),
        # each read while the one before is walked (pickleshard.scan.ahead)
        ahead = (
            [os.path.join(os.fspath(resolved.root), rel) for rel in resolved.files]
            if small and threads == 1 and spans
            else None
        )
        with scratch_scope(ahead=None if ahead is None else partial(ScanAhead, ahead)):
            for pos, got in described_all:
                if isinstance(got, Described):
                    described[pos] = got
                else:
                    rel = resolved.files[pos]
                    skipped.append(skip_record(resolved.absolute(rel), rel, got))
        kept, mismatched = _check_fields(described, resolved, skip_bad)
        index_dir.mkdir(parents=True, exist_ok=True)
        # before the header: the index.json replace is the build's last step
        remember_globals(
            index_dir,
            {
                d.entry.path: ([d.entry.size, d.entry.mtime_ns, d.entry.ino or 0], d.globals)
                for d in kept
                if d.globals is not None and d.entry.etag is None and d.entry.ino is not None
            },
        )
        return write_index(index_dir, resolved, kept, staging, skipped + mismatched, layout)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
