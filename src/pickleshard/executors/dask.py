"""The Dask executor: per-file work of ``index``, ``convert`` and ``verify`` as tasks on a cluster.

:class:`DaskExecutor` is one more :class:`~pickleshard.executors.local.IndexExecutor`: each call
is one ``client.submit`` (a module-level function and small arguments: paths, options, a part's
plan), and results come back through ``distributed.as_completed``, in completion order, so the
caller's progress bar moves as the cluster's futures finish. Results are small (an index row, a
part's summary, a mismatch or None): span arrays and converted parts are written by the workers
to the staging folders, which therefore must be at the same paths on every worker as here (one
machine, or a shared file system).

Failures: a call that raises a :class:`~pickleshard.errors.PickleshardError` (a bad file, an
unencodable value) fails at once, as locally: it is handed back as a value so that Dask does
not retry what would fail again. Any other exception (a flaky network file system) is retried
``retries`` times. A worker that dies mid-call has its calls rescheduled by the scheduler (up
to its ``distributed.scheduler.allowed-failures``, default 3, then
:class:`~pickleshard.errors.ClusterError`); the staging contract (write under a unique
temporary name, rename when complete) makes a call that runs twice or dies midway leave no
partial output.

``distributed`` is imported only when a run starts (``pip install 'pickleshard[dask]'``).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from ..errors import ClusterError, ClusterUnreachableError, MissingDependencyError, PickleshardError

__all__ = ["DaskExecutor", "dask_address", "import_distributed"]

R = TypeVar("R")


@dataclass(frozen=True)
class _Raised:
    """A call's PickleshardError, carried back as a value (Dask would retry a raised one)."""

    error: PickleshardError


def _call(work: Callable[..., Any], *args: Any) -> Any:
    try:
        return work(*args)
    except PickleshardError as exc:
        return _Raised(exc)


class DaskExecutor:
    """Runs calls as tasks on a Dask cluster.

    ``cluster`` is a scheduler address (``"tcp://HOST:PORT"``), a ``distributed.Client`` (used
    as is, never closed here), or ``None``: a ``LocalCluster`` of ``workers`` processes (one
    thread each, so that a convert job's memory budget per process holds) bound to 127.0.0.1,
    started and closed by this executor. Connecting waits ``connect_timeout`` seconds for the
    scheduler and for its first worker, then raises
    :class:`~pickleshard.errors.ClusterUnreachableError` naming the address.

    Used as a context manager, the cluster (or connection) is opened by the first run inside the
    ``with`` and kept for the others until it ends; otherwise each :meth:`run` opens and closes
    its own.
    """

    def __init__(
        self,
        cluster: str | Any | None = None,
        *,
        workers: int | None = None,
        retries: int = 2,
        connect_timeout: float = 10.0,
    ) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.address = cluster if isinstance(cluster, str) else None
        self.workers = workers if workers is not None else min(os.cpu_count() or 1, 8)
        self.retries = retries
        self.connect_timeout = connect_timeout
        self._given = None if isinstance(cluster, str) else cluster
        self._held = False  # inside ``with``: keep what the first run opens
        self._open: tuple[Any, Any] | None = None  # (client, the cluster we started or None)

    def __enter__(self) -> DaskExecutor:
        self._held = True  # the first run opens the cluster; it stays open until __exit__
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._held = False
        if self._open is not None:
            opened, self._open = self._open, None
            self._close(*opened)

    def _connect(self) -> tuple[Any, Any]:
        """(client, the LocalCluster started for it or None)."""
        distributed = import_distributed()
        if self._given is not None:
            return self._given, None
        if self.address is None:
            cluster = distributed.LocalCluster(
                n_workers=self.workers,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",  # its HTTP server: loopback, any free port
                scheduler_kwargs={"dashboard": False},
            )
            try:
                return distributed.Client(cluster, set_as_default=False), cluster
            except BaseException:
                cluster.close()
                raise
        try:
            client = distributed.Client(
                self.address, timeout=self.connect_timeout, set_as_default=False
            )
        except (OSError, TimeoutError) as exc:
            raise ClusterUnreachableError(
                self.address,
                f"cannot connect within {self.connect_timeout:g} s ({exc}); is a scheduler "
                "running there, and reachable from this machine?",
            ) from None
        try:
            client.wait_for_workers(1, timeout=self.connect_timeout)
        except (OSError, TimeoutError):
            client.close()
            raise ClusterUnreachableError(
                self.address,
                f"the scheduler has no workers after {self.connect_timeout:g} s; start some",
            ) from None
        return client, None

    def _close(self, client: Any, cluster: Any) -> None:
        if client is self._given:
            return
        client.close()
        if cluster is not None:
            cluster.close()

    @contextmanager
    def _session(self) -> Iterator[Any]:
        if self._held:
            if self._open is None:
                self._open = self._connect()
            yield self._open[0]
            return
        opened = self._connect()
        try:
            yield opened[0]
        finally:
            self._close(*opened)

    def run(
        self, work: Callable[..., R], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, R], None, None]:
        """``work(*tasks[k])`` as one Dask task each; ``(k, result)`` as each finishes."""
        distributed = import_distributed()
        if not tasks:
            return
        name = f"pickleshard-{getattr(work, '__name__', 'task')}-{uuid.uuid4().hex[:8]}"
        # A remote source's storage options are in the tasks' arguments (a describe task's
        # SourceOptions, a pickled dataset's): nothing is installed on the workers.
        with self._session() as client:
            futures = [
                client.submit(_call, work, *args, key=f"{name}-{k}", retries=self.retries)
                for k, args in enumerate(tasks)
            ]
            position = {fut.key: k for k, fut in enumerate(futures)}
            try:
                for fut in distributed.as_completed(futures, loop=client.loop):
                    k = position[fut.key]
                    try:
                        got = fut.result()
                    except distributed.KilledWorker as exc:
                        raise ClusterError(
                            _where(client),
                            f"task {k} of {len(tasks)} ({getattr(work, '__name__', work)}) "
                            f"was running on every worker that died: {exc}",
                        ) from None
                    if isinstance(got, _Raised):
                        raise got.error
                    yield k, got
            finally:  # an error, or the caller closed us: drop what has not finished
                client.cancel([f for f in futures if not f.done()])


def _where(client: Any) -> str:
    try:
        return str(client.scheduler.address)
    except AttributeError:
        return "the Dask cluster"


_DASK_HINT = "the Dask executor"


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
