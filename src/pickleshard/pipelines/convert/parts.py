"""Writing a conversion's parts: one part per task, in this process, ``jobs`` forked ones, or
on any :mod:`executor <pickleshard.executors.local>` (a Dask cluster).

:func:`write_part` reads a part's samples in batches of ``PartJob.batch`` through the source
:class:`~pickleshard.PickleDataset` (or a mix's :class:`~pickleshard.pipelines.mixed.MixInput`), hashes each (``hashes.bin``, for ``verify``) and hands it
to the format's :class:`~pickleshard.formats.PartWriter`, in a temporary directory renamed into
place when complete; :func:`run_parts` runs the parts not yet done and records each in the
staging manifest as it finishes. Planning, finalizing and publishing are
:mod:`pickleshard.pipelines.convert.run`'s.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing import get_all_start_methods
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import UnencodableValueError
from ...executors import ExecutorLike, ProcessPoolIndexExecutor, resolve_executor
from ...formats import Format, PartSpec, WriteOptions
from ...formats.encoding import encode_member, sample_digest
from ...formats.files import atomic_write_json
from ...formats.staging import Staging
from ..mixed import MixInput

if TYPE_CHECKING:
    from ...dataset import PickleDataset

__all__ = ["PartJob", "run_parts", "write_part"]


@dataclass
class PartJob:
    """What a part needs; installed in each worker once, at fork, instead of per task."""

    dataset: PickleDataset | MixInput
    fmt: Format
    staging: Path
    options: WriteOptions
    batch: int
    parent: int | None  # pid to watch: a worker whose parent died stops instead of racing a rerun


_JOB: PartJob | None = None


def _install(job: PartJob, lock_fd: int) -> None:
    global _JOB
    _JOB = job
    if lock_fd >= 0:  # inherited through fork: the lock must die with the coordinator
        os.close(lock_fd)


def _run_installed(spec: PartSpec) -> dict[str, Any]:
    assert _JOB is not None
    return write_part(_JOB, spec)


def _refused(ds: PickleDataset | MixInput, i: int, message: str) -> UnencodableValueError:
    """The error for sample ``i`` of the input, naming its source file (and, in a mix, which
    source's which sample it is)."""
    if isinstance(ds, MixInput):
        where, sample, what = ds.origin(i)
        return UnencodableValueError(where, f"{what}: {message}", sample=sample)
    pos, _ = ds.index.locate(i)
    return UnencodableValueError(ds.source.absolute(ds.index.files[pos].path), message, sample=i)


def _unencodable(
    ds: PickleDataset | MixInput, i: int, sample: Any, exc: Exception
) -> UnencodableValueError:
    for name, value in zip(ds.fields, sample, strict=False):
        try:
            encode_member(value)
        except TypeError as err:
            return _refused(ds, i, f"field {name!r}: {err}")
    return _refused(ds, i, str(exc))


def write_part(job: PartJob, spec: PartSpec) -> dict[str, Any]:
    """Write part ``spec`` to ``parts/part-<id>`` under the staging directory; its summary.

    Written under a temporary name of its own first, renamed when complete, removed on any
    error (half a part is of no use; one killed midway is removed when a run next starts);
    raises :class:`~pickleshard.errors.UnencodableValueError` naming the source file, sample
    and field of a value the format cannot store.
    """
    parts_dir = job.staging / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    # A name of its own: the same part may run twice at once (a Dask worker presumed dead, a
    # retry on another host with the same pid); neither may delete or fill the other's folder.
    tmp = Path(tempfile.mkdtemp(prefix=f"part-{spec.id:05d}.tmp-", dir=parts_dir))
    try:
        return _write_part_into(job, spec, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # half a part is of no use; free its space now
        raise


def _write_part_into(job: PartJob, spec: PartSpec, tmp: Path) -> dict[str, Any]:
    parts_dir = job.staging / "parts"
    ds, nfields = job.dataset, len(job.options.fields)
    writer = job.fmt.part_writer(tmp, spec, job.options)
    with open(tmp / "hashes.bin", "wb") as hashes:
        for a in range(spec.start, spec.stop, job.batch):
            if job.parent is not None and os.getppid() != job.parent:
                os._exit(1)
            samples = ds.__getitems__(range(a, min(a + job.batch, spec.stop)))
            for i, sample in enumerate(samples, start=a):
                if not isinstance(sample, tuple) or len(sample) != nfields:
                    raise _refused(
                        ds, i, f"expected a tuple of {nfields} fields, got {type(sample).__name__}"
                    )
                try:
                    hashes.write(sample_digest(sample))
                    writer.write(i, sample)
                except TypeError as exc:
                    raise _unencodable(ds, i, sample, exc) from None
    summary = writer.close()
    atomic_write_json(tmp / "part.json", {"spec": asdict(spec), "summary": summary})
    try:
        os.rename(tmp, parts_dir / f"part-{spec.id:05d}")
    except OSError:  # already there from an orphaned worker: same bytes, keep that one
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


def run_parts(
    job: PartJob,
    todo: Sequence[PartSpec],
    jobs: int,
    stage: Staging,
    bar: Any,
    executor: ExecutorLike = None,
) -> None:
    """Write the parts ``todo``, ``jobs`` at a time, marking each done in ``stage`` (and
    advancing the progress ``bar``) as it finishes; the first error cancels the rest.

    ``executor`` (see :func:`~pickleshard.executors.choose.resolve_executor`) runs the parts;
    by default this process, or ``jobs`` forked ones that get the job once, at fork."""
    if not todo:
        return
    work: Callable[..., dict[str, Any]] = write_part
    tasks: list[tuple[Any, ...]] = [(job, spec) for spec in todo]
    local = executor is None or (isinstance(executor, str) and executor == "local")
    if not local or jobs <= 1 or len(todo) <= 1:
        runner = resolve_executor(executor, max(1, jobs), len(todo))
    else:
        # fork where available (as index.py and DataLoader do): spawn would re-run the caller's
        # __main__, and the workers would not share the parent's mapped index pages.
        fork = "fork" in get_all_start_methods()
        job.parent = os.getpid()
        lock_fd = stage.lock_fd if fork else -1
        runner = ProcessPoolIndexExecutor(jobs, initializer=_install, initargs=(job, lock_fd))
        work, tasks = _run_installed, [(spec,) for spec in todo]
    results = runner.run(work, tasks)
    try:
        for k, summary in results:
            stage.mark_done(todo[k], summary)
            bar.update(todo[k].count)
    finally:  # an error here or in a part: the executor cancels what has not started
        results.close()
