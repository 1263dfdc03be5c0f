"""Convert a pickle dataset to memmap, LMDB or WebDataset: bounded memory, parallel, resumable, atomic.

Any other format registered with :func:`pickleshard.formats.register_format` is written the
same way. How :func:`convert` runs:

1. **Plan.** The source's files (as its index lists them) are grouped into *parts*: runs of
   consecutive files of about 1/64 of the dataset's bytes each (a bigger file is a part alone).
   The plan depends only on the source, so every run of the same command plans the same parts.
   A mix (:mod:`pickleshard.pipelines.mixed`) is planned by its epoch's positions instead: about
   64 runs of them, each at least 64 long.
2. **Stage.** Everything is written under ``.<OUT name>.partial/`` next to ``OUT``:
   ``manifest.json`` (the source's identity, the options that shape the output, the plan, and
   the parts already final), ``parts/part-<id>/`` and a lock file.
3. **Write parts**, ``jobs`` processes at a time. A part is written under a temporary name,
   then renamed; only then does the manifest, rewritten atomically, list it as done.
4. **Finalize.** The format merges the parts into its final files (each written under a
   temporary name and renamed), ``hashes.npy`` is assembled, and ``pickleshard.json`` is
   written last: its presence says finalizing is complete.
5. **Publish.** The staging directory is renamed to ``OUT``: ``OUT`` is complete or absent.

Killed at any point, the same command resumes: finished parts are kept, unfinished ones are
redone from scratch, and finalizing reruns if it had not finished. Each part's output is a pure
function of its samples, so the result is byte-identical to an uninterrupted run, and also
independent of ``jobs``. A run whose source files or options differ from the manifest's starts
over: nothing staged for other inputs applies.

Memory: each job holds the samples of one read batch, at most ``memory_bytes / jobs / 4`` of
decoded data by the index's estimate (while whole-file reading is in use, the one decoded source
file the batch comes from), plus write buffers of at most ~10 MiB per field (1 MiB file buffers
and up to 65,536 pending shapes or lengths); finalizing streams through buffers of at most
32 MiB (an LMDB transaction). Nothing grows with the number of samples or files. A mix's
sources opened from paths read out of file order, so each keeps a whole-file cache of
``memory_bytes / jobs / 4`` too.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from tqdm.auto import tqdm

from ..._version import __version__
from ...dataset import PickleDataset
from ...errors import PickleshardError, UnencodableValueError
from ...executors import ExecutorLike, executor_session
from ...formats import Format, PartResult, PartSpec, WriteOptions, get_format
from ...formats.arrow.format import with_row_group_rows
from ...formats.base import DESCRIPTOR_NAME, FORMAT_NAME, FORMAT_VERSION, HASHES_NAME
from ...formats.files import NO_SPACE, NpyWriter, atomic_write_json
from ...formats.staging import Staging
from ...io.listing import Source
from ...mixing import MixedDataset, Policy
from ...producers.plain import TRANSFORM_HINT
from ...scan.layouts import LayoutChoice
from ..inputs import source_dataset
from ..mixed import MixInput, dataset_identity, mix_input, plan_positions
from ..verify.run import verify as verify_output
from .output import finished, out_of_space, size_of
from .parts import PartJob, run_parts

__all__ = [
    "DEFAULT_MEMORY_BYTES",
    "DEFAULT_SHARD_BYTES",
    "ConvertReport",
    "convert",
    "plan_parts",
]

DEFAULT_SHARD_BYTES = 256 << 20
DEFAULT_MEMORY_BYTES = 1 << 30
MAX_PARTS = 64
_MAX_BATCH = 4096


@dataclass(frozen=True)
class ConvertReport:
    """What :func:`convert` did. ``parts_reused`` parts were finished by an interrupted run."""

    out: Path
    to: str
    num_samples: int
    parts: int
    parts_reused: int
    already_done: bool
    seconds: float
    bytes_written: int
    verified: int | None


def plan_parts(
    counts: Sequence[int], sizes: Sequence[int], max_parts: int = MAX_PARTS
) -> list[PartSpec]:
    """Group files (their sample ``counts`` and byte ``sizes``) into consecutive parts.

    A part closes once it holds ``sum(sizes) / max_parts`` bytes, so there are about
    ``max_parts`` parts, more when single files are bigger than that. Empty input -> no parts.
    """
    target = sum(sizes) / max_parts
    parts: list[PartSpec] = []
    first_file = start = sample = 0
    held = 0
    for f, (n, size) in enumerate(zip(counts, sizes, strict=True)):
        sample += n
        held += size
        if held >= target or f == len(counts) - 1:
            parts.append(PartSpec(len(parts), start, sample, first_file, f + 1))
            first_file, start, held = f + 1, sample, 0
    return parts


def _identity(ds: PickleDataset | MixInput, fmt: Format, shard_bytes: int) -> dict[str, Any]:
    if isinstance(ds, MixInput):  # a mix records each source's encoding with the source
        source, encoding = ds.identity(), None
    else:
        source, encoding = dataset_identity(ds), ds.policy.encoding
    return {
        "source": source,
        "options": {
            "to": fmt.name,
            "format": fmt.options_key(),
            "shard_bytes": shard_bytes if fmt.uses_shard_bytes else None,
            "encoding": encoding,
        },
    }


def _job_count(jobs: int | None) -> int:
    return max(1, jobs if jobs is not None else min(os.cpu_count() or 1, 8))


def _sample_bytes(ds: PickleDataset | MixInput) -> int:
    """The largest decoded size of a sample, by the index's estimate: sizes a read batch."""
    if isinstance(ds, MixInput):
        return ds.sample_bytes()
    files = ds.index.files
    return max((f.decoded_nbytes // max(1, f.num_samples) for f in files), default=1)


def _finalize(
    job: PartJob, stage: Staging, plan: Sequence[PartSpec], identity: dict[str, Any]
) -> None:
    staging, fmt, options = job.staging, job.fmt, job.options
    results = [
        PartResult(staging / "parts" / f"part-{p.id:05d}", p, stage.done[str(p.id)]) for p in plan
    ]
    entries = fmt.finalize(staging, results, options)
    hashes = NpyWriter(staging / HASHES_NAME, np.dtype(np.uint8), (options.num_samples, 16))
    for part in results:
        hashes.copy_from(part.dir / "hashes.bin")
    hashes.close()
    descriptor = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "to": fmt.name,
        "tool_version": __version__,
        "num_samples": options.num_samples,
        "hashes": HASHES_NAME,
        "sample_form": identity["source"].get("sample_form", "tuple"),
        **entries,
        "identity": identity,
    }
    atomic_write_json(staging / DESCRIPTOR_NAME, descriptor)


def _stage_and_publish(
    stage: Staging,
    ds: PickleDataset | MixInput,
    fmt: Format,
    plan: Sequence[PartSpec],
    identity: dict[str, Any],
    jobs: int | None,
    shard_bytes: int,
    memory_bytes: int,
    progress: bool,
    executor: ExecutorLike,
) -> int:
    """Write the parts not yet done, finalize, publish; the number of parts reused."""
    with stage:
        reused = len(plan) if stage.finalized else len(stage.done)
        options = WriteOptions(tuple(ds.fields), len(ds), shard_bytes)
        n_jobs = _job_count(jobs)
        per_sample = _sample_bytes(ds)
        batch = int(np.clip(memory_bytes // n_jobs // 4 // max(1, per_sample), 1, _MAX_BATCH))
        job = PartJob(ds, fmt, stage.path, options, batch, None)
        todo = [] if stage.finalized else [p for p in plan if str(p.id) not in stage.done]
        with tqdm(
            total=len(ds), unit="sample", desc=f"convert to {fmt.name}", disable=not progress
        ) as bar:
            bar.update(sum(p.count for p in plan) - sum(p.count for p in todo))
            run_parts(job, todo, min(n_jobs, len(todo)), stage, bar, executor)
        if not stage.finalized:
            stage.clear_outputs()
            try:
                _finalize(job, stage, plan, identity)
            except OSError:
                with contextlib.suppress(OSError):
                    stage.clear_outputs()  # a half-merged output is redone anyway: free it now
                raise
        stage.publish()
    return reused


def convert(
    source: Source | PickleDataset | MixedDataset | Sequence[Any],
    out: str | os.PathLike[str],
    *,
    to: str | Format | type[Format] = "memmap",
    jobs: int | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    verify: bool = False,
    progress: bool = False,
    trusted: bool = False,
    allow_globals: Iterable[str] = (),
    encoding: str = "ASCII",
    overwrite: bool = False,
    row_group_rows: int | None = None,
    executor: ExecutorLike = None,
    allow: str | Iterable[str] = (),
    transform: Callable[[Any], Any] | None = None,
    layout: LayoutChoice = "auto",
    storage_options: Mapping[str, Any] | None = None,
    weights: Sequence[float] | None = None,
    epoch_size: int | None = None,
    policy: Policy = "repeat",
    seed: int = 0,
    tag: bool = False,
) -> ConvertReport:
    """Convert ``source`` to format ``to`` in directory ``out``; see the module docstring.

    ``allow`` names allowlist presets as :class:`~pickleshard.PickleDataset` takes them (the
    source's files are audited when it opens: every refused global is reported at once).
    ``transform``, a callable from a sample tuple to a sample tuple, runs on each sample before
    it is encoded (after the dataset's own ``transform``); then PIL images become ``uint8``
    arrays and scipy sparse matrices ``(data, indices, indptr, shape)``
    (:mod:`pickleshard.producers.plain`). A value no format can store raises
    :class:`~pickleshard.errors.UnencodableValueError` naming the field, which suggests
    ``transform``. Resume with the same ``transform``: the manifest cannot tell them apart.

    ``source`` is what :class:`~pickleshard.PickleDataset` takes (directory, glob, file list)
    or a PickleDataset (its ``trusted``/``allow_globals``/``encoding`` then apply; samples are
    what it returns, after its ``transform``, which the manifest cannot tell apart: resume with
    the same one). ``to`` is ``"memmap"``, ``"lmdb"``,
    ``"webdataset"``, the name of another registered format, or a registered
    :class:`~pickleshard.formats.Format` class or instance (an unregistered one raises
    ``ValueError``: :func:`~pickleshard.formats.open_dataset` could not open it). ``jobs`` processes write parts
    (default: CPUs, at most 8). ``shard_bytes`` caps WebDataset shards. ``memory_bytes`` is the
    read budget across jobs. ``verify=True`` then reads every sample of the output back and
    compares its content hash with the digest taken of the source sample as it was converted
    (``hashes.npy``), without reading the source again. ``overwrite=True`` replaces an existing
    conversion. ``row_group_rows`` sets the Parquet/Arrow row-group size (a ``ValueError`` for
    other formats; see :mod:`pickleshard.formats.arrow.format`). ``executor`` runs the parts elsewhere
    (``"dask"``, ``"dask://HOST:PORT"``, a ``distributed.Client``: see
    :func:`~pickleshard.executors.choose.resolve_executor`), with
    the same output, byte for byte; its workers must see ``source`` and ``out`` at the same
    paths. ``layout`` is :class:`~pickleshard.PickleDataset`'s (what a file or record is), and
    so are ``storage_options`` (a URL's credentials, endpoint...: they travel to the workers
    inside the pickled dataset, never into the output).

    **A materialized mix** (``docs/mixing.md``): ``source`` a
    :class:`~pickleshard.MixedDataset`, or ``weights`` given with a list of sources (each a
    path as above, a folder holding a conversion, or a dataset; one source alone is a list of
    one) and ``epoch_size``, ``policy``, ``seed`` and ``tag`` as ``MixedDataset`` takes them.
    The output holds exactly the samples of the mix's epoch (0, or the one it is set to), in
    its order: sample ``i`` is ``mix[i]`` (after ``transform``); its descriptor records the mix,
    so ``verify`` rebuilds it from the same sources. Mix options without a mix raise ``ValueError``.

    Rerunning after a kill resumes; rerunning after success returns at once
    (``already_done``). Raises :class:`~pickleshard.errors.OutputPathError` if ``out`` cannot
    be written, :class:`~pickleshard.errors.OutputExistsError` if it holds something else,
    :class:`~pickleshard.errors.ConversionStateError` if another conversion to ``out`` is
    running, :class:`~pickleshard.errors.OutputSpaceError` when the output's disk fills up
    (finished parts are kept: rerun after freeing space to resume), :class:`~pickleshard.errors.UnencodableValueError` for a value the safe
    encoding cannot store, and :class:`~pickleshard.errors.VerifyMismatchError` from ``verify``.
    """
    t0 = time.perf_counter()
    if shard_bytes < 1 or memory_bytes < 1:
        raise ValueError(
            f"shard_bytes and memory_bytes must be >= 1, got {shard_bytes}, {memory_bytes}"
        )
    fmt = get_format(to)
    if row_group_rows is not None:
        fmt = with_row_group_rows(fmt, row_group_rows)
    out_path = Path(out).absolute()
    opening: dict[str, Any] = {
        "trusted": trusted,
        "allow_globals": allow_globals,
        "encoding": encoding,
        "jobs": jobs,
        "progress": progress,
        "allow": allow,
        "layout": layout,
        "storage_options": storage_options,
    }
    mix = mix_input(
        source,
        weights=weights,
        epoch_size=epoch_size,
        policy=policy,
        seed=seed,
        tag=tag,
        transform=transform,
        # a mix reads its sources' files out of order: a cache within the read budget helps
        opening={**opening, "cache_bytes": memory_bytes // _job_count(jobs) // 4},
    )
    if mix is None:  # one source, as before mixing existed
        ds: PickleDataset | MixInput = source_dataset(
            cast("Source | PickleDataset", source), transform=transform, **opening
        )
    else:
        ds = mix
    identity = _identity(ds, fmt, shard_bytes)
    if isinstance(ds, MixInput):
        plan = plan_positions(len(ds), MAX_PARTS)
    else:
        files = ds.index.files
        plan = plan_parts([f.num_samples for f in files], [f.size for f in files])
    verified: int | None = None
    reused = 0
    done_already = finished(out_path, identity, overwrite)
    with executor_session(executor, jobs) as executor:  # one cluster for parts and verify
        if not done_already:
            stage = Staging(out_path, identity, plan)
            try:
                reused = _stage_and_publish(
                    stage,
                    ds,
                    fmt,
                    plan,
                    identity,
                    jobs,
                    shard_bytes,
                    memory_bytes,
                    progress,
                    executor,
                )
            except UnencodableValueError as exc:
                exc.args = (f"{exc.args[0]}; {TRANSFORM_HINT}",)  # the way out, said once here
                raise
            except OSError as exc:
                if isinstance(exc, PickleshardError) or exc.errno not in NO_SPACE:
                    raise
                raise out_of_space(stage, len(plan), exc) from None
        if verify:
            verified = verify_output(None, out_path, progress=progress, executor=executor).checked
    return ConvertReport(
        out=out_path,
        to=fmt.name,
        num_samples=len(ds),
        parts=len(plan),
        parts_reused=reused,
        already_done=done_already,
        seconds=time.perf_counter() - t0,
        bytes_written=size_of(out_path),
        verified=verified,
    )
