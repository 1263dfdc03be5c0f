"""Where per-file work runs: the one executor seam of ``index``, ``convert`` and ``verify``
(:mod:`.local`: in this process or local worker processes; :mod:`.dask`: a Dask cluster).
"""

from .local import IndexExecutor, InlineExecutor, ProcessPoolIndexExecutor

__all__ = ["IndexExecutor", "InlineExecutor", "ProcessPoolIndexExecutor"]
