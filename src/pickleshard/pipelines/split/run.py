"""Split one pickle file into chunk pickles of the same layout, in memory O(largest sample).

:func:`split` cuts ``BIG.pickle`` into ``OUT/BIG-00000.pickle``, ``OUT/BIG-00001.pickle``...:
each chunk is one ordinary pickle (plain :func:`pickle.load` reads it, and so does pickleshard's
scanner) of the source's layout and protocol holding a contiguous run of its samples, so that
loading the chunks in order and concatenating their samples gives the source's samples.

Layouts, as :mod:`pickleshard.scan.layouts` names them, keep their containers: ``columns`` stays a
tuple or a list of fields, each field a list, a tuple or a numpy array (a chunk holds the
array's rows ``[a, b)``); ``dict_columns`` a dict with the same keys; ``rows`` a list of tuples;
``dict_rows`` a list of dicts. A file of appended pickles that are each a layout gives chunks of
that layout (one pickle each); a file of one sample per pickle gives chunks of one sample per
pickle. Dict keys are written as the scanner's field names (``str``). Protocols 0/1 are written
as protocol 2. Object identity between two *fields* of one sample of a column layout is not kept
(the values are equal); within one field, or one row, it is.

How a chunk is written without holding it (:mod:`pickleshard.pipelines.split.chunkwriter`): the container
opcodes are written one by one and each sample, read alone through
:class:`~pickleshard.read.SpanReader` under the caller's
:class:`~pickleshard.safety.policy.UnpicklePolicy`, is saved into the same stream; the rows of an array
field are copied from the source in blocks (:mod:`pickleshard.pipelines.split.source`). Memory: the
largest sample, one 8 MiB copy block, the scan's per-sample arrays (``8 * (3F + 2)`` bytes a
sample for F fields) and a 64 KiB pickle frame. The scanner maps the whole file read-only:
address space the size of the file, but no memory (pass ``scan=`` to run under an
address-space limit).

Atomic and resumable: the plan (sample ranges and chunk names) is written first to
``OUT/pickleshard-split.json``; each chunk is written under a temporary name and renamed when
complete; the manifest is rewritten with ``"complete": true`` last. A rerun with the same source
(size and mtime) and limits keeps the finished chunks and writes the rest, or reports that the
split is already done.

A file the scanner refuses (:class:`~pickleshard.errors.NotSpanIndexableError`) is loaded whole
when three times its size fits ``memory_bytes``; otherwise :func:`split` raises that error,
naming the file, the scanner's reason and the budget.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import (
    OutputExistsError,
    OutputPathError,
    OutputSpaceError,
    PickleshardError,
    UnreadableFileError,
)
from ...formats.files import NO_SPACE
from ...io.atomic import TMP_MARK, atomic_file, write_bytes_atomic
from ...io.listing import check_regular_file
from ...safety.policy import UnpicklePolicy
from ...scan import ScanResult
from .chunkwriter import ChunkShape, SampleSource, write_chunk
from .source import open_source

__all__ = ["DEFAULT_MEMORY_BYTES", "MANIFEST", "SplitReport", "split"]

MANIFEST = "pickleshard-split.json"
DEFAULT_MEMORY_BYTES = 1 << 30
_FORMAT = 1


@dataclass(frozen=True)
class SplitReport:
    """What :func:`split` did: ``chunks`` are all the chunk files, in sample order."""

    source: Path
    out: Path
    chunks: list[Path]
    num_samples: int
    chunks_reused: int
    already_done: bool
    whole_file: bool
    bytes_written: int
    seconds: float


def _boundaries(sizes: np.ndarray, max_bytes: int | None, max_samples: int | None) -> list[int]:
    """Chunk starts and the end: at most ``max_samples`` samples and, by the span sizes,
    ``max_bytes`` bytes a chunk (a sample larger than that is a chunk alone)."""
    n = len(sizes)
    cum = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    cuts, a = [0], 0
    while a < n:
        b = n if max_samples is None else min(n, a + max_samples)
        if max_bytes is not None:
            b = min(b, int(np.searchsorted(cum, cum[a] + max_bytes, "right")) - 1)
        b = max(b, a + 1)
        cuts.append(b)
        a = b
    return cuts


def _identity(path: Path, max_bytes: int | None, max_samples: int | None) -> dict[str, Any]:
    st = path.stat()
    return {
        "format": _FORMAT,
        "source": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "max_bytes": max_bytes,
        "max_samples": max_samples,
    }


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    write_bytes_atomic(path, json.dumps(obj, indent=1).encode())


def _chunk_names(stem: str, count: int) -> list[str]:
    width = max(5, len(str(max(count - 1, 0))))
    return [f"{stem}-{k:0{width}d}.pickle" for k in range(count)]


def split(
    src_file: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    max_samples: int | None = None,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    encoding: str = "ASCII",
    trusted: bool = False,
    allow_globals: Iterable[str] = (),
    overwrite: bool = False,
    scan: ScanResult | None = None,
) -> SplitReport:
    """Split ``src_file`` into chunk pickles in ``out_dir`` (see the module docstring).

    At least one of ``max_bytes`` (by the samples' pickled sizes in the source) and
    ``max_samples`` bounds each chunk. Samples are unpickled under the policy of ``trusted`` /
    ``allow_globals`` / ``encoding``. ``memory_bytes`` bounds the whole-file fallback.
    ``overwrite`` replaces the chunks of an earlier split with other limits or of another
    source version; without it that raises :class:`OutputExistsError`. ``scan`` is the file's
    :class:`~pickleshard.scan.ScanResult` if the caller has it (from an index): the scanner
    maps the whole file read-only, which needs address space (not memory) the size of the file.
    ``src_file`` must be a regular file (:class:`NotRegularFileError` otherwise, before it is
    opened); a full output disk raises :class:`OutputSpaceError` (rerun to resume).
    """
    if max_bytes is None and max_samples is None:
        raise ValueError("give max_bytes or max_samples")
    for name, v in (("max_bytes", max_bytes), ("max_samples", max_samples)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be at least 1, got {v}")
    t0 = time.perf_counter()
    path = Path(src_file).resolve()
    out = Path(out_dir)
    policy = UnpicklePolicy.from_args(
        trusted=trusted, allow_globals=allow_globals, encoding=encoding
    )
    try:
        check_regular_file(src_file)  # before anything opens it: a FIFO would block
        ident = _identity(path, max_bytes, max_samples)
    except OSError as exc:
        if isinstance(exc, UnreadableFileError):
            raise
        raise UnreadableFileError(path, f"cannot read: {exc.strerror or exc}") from None
    manifest_path = out / MANIFEST
    old = _read_manifest(manifest_path)
    if old is not None and {k: old.get(k) for k in ident} != ident:
        if not overwrite:
            raise OutputExistsError(
                out,
                f"holds a split of {old.get('source')} with other limits or of another version "
                f"of the source; pass overwrite=True (CLI: --overwrite) to replace it",
            )
        for name in old.get("chunks", []):
            (out / name).unlink(missing_ok=True)
        manifest_path.unlink()
        old = None
    chunks = [out / n for n in old["chunks"]] if old is not None else []
    if old is not None and old.get("complete") and all(c.exists() for c in chunks):
        return SplitReport(
            path, out, chunks, old["samples"], len(chunks), True, old["whole_file"], 0, 0.0
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(out, f"cannot create: {exc.strerror or exc}") from None
    try:
        limits = (max_bytes, max_samples)
        return _split_into(path, out, ident, old, policy, memory_bytes, scan, limits, t0)
    except OSError as exc:
        if isinstance(exc, PickleshardError) or exc.errno not in NO_SPACE:
            raise
        raise _out_of_space(out, exc) from None


def _split_into(
    path: Path,
    out: Path,
    ident: dict[str, Any],
    old: dict[str, Any] | None,
    policy: UnpicklePolicy,
    memory_bytes: int,
    scan: ScanResult | None,
    limits: tuple[int | None, int | None],
    t0: float,
) -> SplitReport:
    manifest_path = out / MANIFEST
    src, shape, whole = open_source(path, policy, memory_bytes, scan)
    try:
        if old is None:
            cuts = _boundaries(src.sizes(), *limits)
            names = _chunk_names(path.stem, len(cuts) - 1)
            for name in names:
                if (out / name).exists():
                    raise OutputExistsError(out / name, "is in the way of a chunk of this split")
            manifest = {
                **ident,
                "layout": shape.kind,
                "samples": src.num_samples,
                "whole_file": whole,
                "cuts": cuts,
                "chunks": names,
                "complete": False,
            }
            _write_json(manifest_path, manifest)
        else:
            manifest = old
        cuts, names = manifest["cuts"], manifest["chunks"]
        written, reused = 0, 0
        for k, name in enumerate(names):
            final = out / name
            if final.exists():
                reused += 1
                continue
            written += _write_one(final, src, shape, cuts[k], cuts[k + 1])
    finally:
        src.close()
    _write_json(manifest_path, {**manifest, "complete": True})
    return SplitReport(
        path,
        out,
        [out / n for n in names],
        src.num_samples,
        reused,
        False,
        whole,
        written,
        time.perf_counter() - t0,
    )


def _out_of_space(out: Path, exc: OSError) -> OutputSpaceError:
    """The error for a full output file system: the chunks kept, and that a rerun resumes."""
    try:
        names = (_read_manifest(out / MANIFEST) or {}).get("chunks", [])
    except OutputExistsError:
        names = []
    done = [out / n for n in names if (out / n).is_file()]
    kept = sum(c.stat().st_size for c in done)
    what = "no space left on device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
    progress = (
        f"after writing {len(done)} of {len(names)} chunks ({kept / 1e6:.1f} MB)"
        if names
        else "before the first chunk"
    )
    err = OutputSpaceError(
        out, f"{what} {progress}; free space and rerun the same command to resume"
    )
    err.errno = exc.errno
    return err


def _write_one(final: Path, src: SampleSource, shape: ChunkShape, a: int, b: int) -> int:
    for stale in final.parent.glob(f"{final.name}{TMP_MARK}*"):
        stale.unlink(missing_ok=True)  # left by a killed run
    with atomic_file(final, fsync=True, buffering=1 << 20) as fh:
        write_chunk(fh, src, shape, a, b)
    return final.stat().st_size


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise OutputExistsError(path, f"is not a readable split manifest: {exc}") from None
    return obj if isinstance(obj, dict) else None
