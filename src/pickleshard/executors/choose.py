"""Choosing the executor: what a user passes as ``executor=`` (``None``, ``"local"``,
``"dask"``, ``"dask://HOST:PORT"``, a ``distributed.Client``, an executor) turned into one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

from .dask import DaskExecutor, _is_dask_client, dask_address
from .local import IndexExecutor, local_executor

__all__ = ["ExecutorLike", "executor_session", "resolve_executor"]

# A distributed.Client too; typed loosely so that dask stays an optional dependency.
ExecutorLike: TypeAlias = IndexExecutor | str | Any | None


def resolve_executor(spec: ExecutorLike, jobs: int | None, tasks: int) -> IndexExecutor:
    """The executor ``spec`` names, for ``tasks`` calls with at most ``jobs`` at once (None:
    one, in this process, locally; the CPU count, at most 8, for a local Dask cluster).

    ``None`` or ``"local"``: :func:`local_executor`. ``"dask"``: a ``LocalCluster`` of ``jobs``
    worker processes on 127.0.0.1, started for each run and closed after it. ``"dask://HOST:PORT"``
    or ``"dask=ADDRESS"`` (``tcp://HOST:PORT``, ``HOST:PORT``...): the scheduler there. A
    ``distributed.Client``: its cluster (left open). An object with :meth:`IndexExecutor.run`:
    itself. Anything else raises ``ValueError`` (a string) or ``TypeError``.
    """
    if spec is None or (isinstance(spec, str) and spec == "local"):
        return local_executor(jobs if jobs is not None else 1, tasks)
    if isinstance(spec, str):
        address = dask_address(spec)
        return DaskExecutor(address, workers=jobs)
    if _is_dask_client(spec):
        return DaskExecutor(spec)
    if callable(getattr(spec, "run", None)):
        return spec
    raise TypeError(
        f"executor must be 'local', 'dask', 'dask://HOST:PORT', a distributed.Client or an "
        f"object with a run(work, tasks) method, got {type(spec).__name__}"
    )


@contextmanager
def executor_session(spec: ExecutorLike, jobs: int | None) -> Iterator[ExecutorLike]:
    """``spec`` held open for several runs: a Dask executor (``"dask"``, an address, a
    ``distributed.Client``) connects, or starts its ``LocalCluster`` of ``jobs`` workers, once
    for the ``with`` and closes it after; anything else is yielded as it is."""
    if not (isinstance(spec, str) and spec != "local") and not _is_dask_client(spec):
        yield spec
        return
    workers = jobs if jobs is not None else min(os.cpu_count() or 1, 8)
    with DaskExecutor(dask_address(spec) if isinstance(spec, str) else spec, workers=workers) as ex:
        yield ex
