"""Where per-file work runs: the one executor seam of ``index``, ``convert`` and ``verify``
(:mod:`.local`: in this process or local worker processes; :mod:`.dask`: a Dask cluster;
:mod:`.choose`: what ``executor=`` names, turned into one).
"""

from .choose import ExecutorLike, executor_session, resolve_executor
from .dask import DaskExecutor, dask_address
from .local import IndexExecutor, InlineExecutor, ProcessPoolIndexExecutor, local_executor

__all__ = [
    "DaskExecutor",
    "ExecutorLike",
    "IndexExecutor",
    "InlineExecutor",
    "ProcessPoolIndexExecutor",
    "dask_address",
    "executor_session",
    "local_executor",
    "resolve_executor",
]
