"""The dataset index: which samples live in which file and where, saved beside the data, opened
by mmap, checked as untrusted input, and rebuilt when the data changes.

Modules, one concern each (all names below are importable from ``pickleshard.index``):

- :mod:`~pickleshard.index.ondisk`: file names, format version, ``index.json`` read safely;
- :mod:`~pickleshard.index.model`: :class:`DatasetIndex`, the opened index (arrays mmap'd);
- :mod:`~pickleshard.index.files`: the files table (:class:`FileEntry`), skipped-file records,
  the content :func:`fingerprint`;
- :mod:`~pickleshard.index.staleness`: which files changed, went away or appeared;
- :mod:`~pickleshard.index.checking`, :mod:`~pickleshard.index.validate`,
  :mod:`~pickleshard.index.validate_scan`: validation of an untrusted ``index.json``;
- :mod:`~pickleshard.index.arrays`, :mod:`~pickleshard.index.contents`: the ``.npy`` files
  (opened without unpickling, CRC-32) and what they hold;
- :mod:`~pickleshard.index.describe`: indexing one file (the per-file work of a build);
- :mod:`~pickleshard.index.executor`: where that work (and convert's and verify's) runs
  (:class:`IndexExecutor`: in this process, local worker processes by default, or a Dask
  cluster, :mod:`~pickleshard.index.dask_executor`);
- :mod:`~pickleshard.index.build`, :mod:`~pickleshard.index.write`: :func:`build_index`, and
  writing the arrays and the header;
- :mod:`~pickleshard.index.opening`: :func:`open_index`, with its rebuild policy.
"""

from .build import build_index
from .executor import IndexExecutor, InlineExecutor, ProcessPoolIndexExecutor
from .files import FileEntry, SkippedFile, fingerprint
from .model import DatasetIndex, SkippedFilesWarning
from .ondisk import FORMAT_NAME, FORMAT_VERSION, default_index_path
from .opening import Rebuild, open_index

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "DatasetIndex",
    "FileEntry",
    "IndexExecutor",
    "InlineExecutor",
    "ProcessPoolIndexExecutor",
    "Rebuild",
    "SkippedFile",
    "SkippedFilesWarning",
    "build_index",
    "default_index_path",
    "fingerprint",
    "open_index",
]
