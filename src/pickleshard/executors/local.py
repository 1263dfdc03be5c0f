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

This process, threads or processes, for an index build (``python -m bench open --executors``,
``bench/results/index-executors.md``: 2 cores shared with other jobs, best of 3, seconds; 12 KB
arrays and small-object files as in ``bench/results/first-open.md``, copied to 2, 8, 32 files):

=================  ======  ======  ======  ======  ======  ======
build of           arrays                  objects
-----------------  ----------------------  ----------------------
files              2       8       32      2       8       32
=================  ======  ======  ======  ======  ======  ======
inline             0.031   0.063   0.212   0.167   0.870   3.552
2 threads          0.036   0.085   0.258   0.187   0.753   4.644
2 processes        0.118   0.110   0.280   0.257   0.811   4.196
=================  ======  ======  ======  ======  ======  ======

(An earlier run, same machine: inline 0.024/0.062/0.180 and 0.150/0.702/2.910, threads
0.039/0.099/0.271 and 0.169/0.714/3.140, processes 0.065/0.103/0.343 and 0.221/1.052/4.377.)
Threads do not pay: the compiled walk holds the GIL (it builds the Python lists the layout
matching reads), so two threads take turns; the one row where they came first (objects, 8
files) was not repeated by the earlier run. Processes pay only with idle cores to run on: on
this loaded 2-core machine not even at 32 files (a worker's start, the staged arrays and the
results' pickling cost more than the second core gives). Hence the index build's rule
(:data:`pickleshard.indexing.build.INLINE_FILES`): up to 16 files in this process, more in a
process pool of one worker per CPU, where the cores are there to use.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext
from typing import Any, Protocol, TypeVar

__all__ = [
    "IndexExecutor",
    "InlineExecutor",
    "ProcessPoolIndexExecutor",
    "local_executor",
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
    """Every call in this process, results in task order: one after another, or up to
    ``threads`` at once, for calls that mostly wait (a remote object's fetches release the
    GIL: several files' round trips and downloads overlap where one after another they add)."""

    def __init__(self, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads

    def run(
        self, work: Callable[..., R], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, R], None, None]:
        if self.threads == 1 or len(tasks) <= 1:
            for k, args in enumerate(tasks):
                yield k, work(*args)
            return
        with ThreadPoolExecutor(min(self.threads, len(tasks))) as pool:
            futures = [pool.submit(work, *args) for args in tasks]
            try:
                for k, fut in enumerate(futures):
                    yield k, fut.result()
            finally:  # an error, or the caller closed us: drop what has not started
                for fut in futures:
                    fut.cancel()


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
