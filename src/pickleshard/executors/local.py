"""Where per-file work runs: the one executor seam of ``index``, ``convert`` and ``verify``.

A caller hands :meth:`IndexExecutor.run` one picklable function and one picklable argument
tuple per task (a file to index, a part to convert, a run of samples to verify), and takes the
results back in completion order, updating its progress bar as each arrives. The executor
decides where the calls run: :class:`InlineExecutor` in this process,
:class:`ProcessPoolIndexExecutor` in local worker processes (the default, see
:func:`local_executor`), :class:`~pickleshard.executors.dask.DaskExecutor` on a Dask
cluster, whose workers must see the dataset, the index and the output at the same paths as the
caller. :func:`resolve_executor` turns what a user passes (``None``, ``"local"``, ``"dask"``,
``"dask://HOST:PORT"``, a ``distributed.Client``, an executor) into one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext
from typing import Any, Protocol, TypeAlias, TypeVar

from ..errors import MissingDependencyError

__all__ = [
    "ExecutorLike",
    "IndexExecutor",
    "InlineExecutor",
    "ProcessPoolIndexExecutor",
    "dask_address",
    "executor_session",
    "local_executor",
    "resolve_executor",
]

R = TypeVar("R")


class IndexExecutor(Protocol):
    """Runs a build's per-file calls somewhere and hands their results back as they finish."""

    def run(
        self, work: Callable[..., R], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, R], None, None]:
        """Call ``work(*tasks[k])`` for every ``k`` and yield ``(k, result)`` as each call
        completes, in any order. An exception a call raises is raised by the generator, and
        closing it early (the caller stopped at an error) cancels the calls not yet
        started. ``work`` is a module-level function and ``tasks`` plain data: both pickle."""
        ...


class InlineExecutor:
    """Every call in this process, one after another, in task order."""

    def run(
        self, work: Callable[..., R], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, R], None, None]:
        for k, args in enumerate(tasks):
            yield k, work(*args)


def _pool_context() -> BaseContext:
    # fork where available (as DataLoader does): spawn and forkserver re-run the caller's
    # __main__, which breaks stdin scripts and scripts without a __main__ guard.
    methods = get_all_start_methods()
    return get_context("fork" if "fork" in methods else "spawn")


class ProcessPoolIndexExecutor:
    """Calls in at most ``jobs`` local worker processes (forked where the platform can);
    ``initializer(*initargs)`` runs once in each (to install what every call shares)."""

    def __init__(
        self,
        jobs: int,
        *,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.jobs = jobs
        self.initializer = initializer
        self.initargs = initargs

    def run(
        self, work: Callable[..., R], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, R], None, None]:
        with ProcessPoolExecutor(
            self.jobs, _pool_context(), initializer=self.initializer, initargs=self.initargs
        ) as pool:
            futures: dict[Future[R], int] = {
                pool.submit(work, *args): k for k, args in enumerate(tasks)
            }
            try:
                for fut in as_completed(futures):
                    yield futures[fut], fut.result()
            finally:  # an error, or the caller closed us: drop what has not started
                for fut in futures:
                    fut.cancel()


def local_executor(jobs: int, tasks: int) -> IndexExecutor:
    """The default executor for ``tasks`` calls with at most ``jobs`` at once: in this process
    when ``jobs <= 1`` or there is one call (a pool would only add its start-up), else a pool."""
    if jobs <= 1 or tasks <= 1:
        return InlineExecutor()
    return ProcessPoolIndexExecutor(jobs)


# A distributed.Client too; typed loosely so that dask stays an optional dependency.
ExecutorLike: TypeAlias = IndexExecutor | str | Any | None

_DASK_HINT = "the Dask executor"


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
        from .dask import DaskExecutor

        return DaskExecutor(address, workers=jobs)
    if _is_dask_client(spec):
        from .dask import DaskExecutor

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
    from .dask import DaskExecutor

    with DaskExecutor(dask_address(spec) if isinstance(spec, str) else spec, workers=workers) as ex:
        yield ex


def dask_address(spec: str) -> str | None:
    """The scheduler address in an executor string (None: start a local cluster).

    ``"dask"`` -> None; ``"dask://HOST:PORT"`` -> ``"tcp://HOST:PORT"``; ``"dask=ADDRESS"`` ->
    ``ADDRESS`` (``tcp://`` added when it has no scheme). ``ValueError`` for any other string.
    """
    text = spec.strip()
    if text == "dask":
        return None
    if text.startswith("dask://"):
        address = "tcp://" + text[len("dask://") :]
    elif text.startswith("dask="):
        address = text[len("dask=") :].strip()
        if "://" not in address:
            address = "tcp://" + address
    else:
        raise ValueError(
            f"executor must be 'local', 'dask', 'dask://HOST:PORT' or 'dask=ADDRESS', got {spec!r}"
        )
    if address.endswith("://"):
        raise ValueError(f"executor {spec!r} names no scheduler address")
    return address


def _is_dask_client(spec: object) -> bool:
    distributed = sys.modules.get("distributed")  # a Client exists only if it was imported
    return distributed is not None and isinstance(spec, distributed.Client)


def import_distributed() -> Any:
    """The ``distributed`` module, or :class:`MissingDependencyError` with the install hint."""
    try:
        import distributed
    except ImportError:
        raise MissingDependencyError("distributed", "dask", _DASK_HINT) from None
    return distributed
