"""The dataset index, as data: which samples live in which file and where, saved beside the
data, opened by mmap, checked as untrusted input, and told stale when the data changes.

This package is the data model only (it imports :mod:`pickleshard.io` and :mod:`pickleshard.scan`);
building an index, which reads files, is :mod:`pickleshard.indexing`.

- :mod:`~pickleshard.index.ondisk`: file names, format version, ``index.json`` read safely;
- :mod:`~pickleshard.index.model`: :class:`DatasetIndex`, the opened index (arrays mmap'd);
- :mod:`~pickleshard.index.files`: the files table (:class:`FileEntry`), skipped-file records,
  the content :func:`fingerprint`;
- :mod:`~pickleshard.index.staleness`: which files changed, went away or appeared;
- :mod:`~pickleshard.index.checking`, :mod:`~pickleshard.index.validate`,
  :mod:`~pickleshard.index.validate_scan`: validation of an untrusted ``index.json``;
- :mod:`~pickleshard.index.arrays`, :mod:`~pickleshard.index.contents`: the ``.npy`` files
  (opened without unpickling, CRC-32) and what they hold.
"""

from .files import FileEntry, SkippedFile, fingerprint
from .model import DatasetIndex, SkippedFilesWarning
from .ondisk import FORMAT_NAME, FORMAT_VERSION, default_index_path

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "DatasetIndex",
    "FileEntry",
    "SkippedFile",
    "SkippedFilesWarning",
    "default_index_path",
    "fingerprint",
]
