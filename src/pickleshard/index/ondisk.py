"""Where an index lives and what its files are called; opening them without trusting them.

The index directory (default ``DIR/.pickleshard/``, see :func:`default_index_path`) holds
``index.json`` (the versioned header, :data:`FORMAT_NAME` version :data:`FORMAT_VERSION`) and
the arrays it names (:data:`ARRAY_NAME` file names: ``samples`` of :data:`SAMPLES_DTYPE`, and
the :data:`SPAN_ARRAYS`). These files are ours, not the user's data, so they are opened here
directly; still, an index may come with a downloaded dataset, and :func:`open_index_file` is the
one way any of them is opened for reading: it never blocks on a FIFO planted under its name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import IndexFormatError
from ..io.listing import INDEX_DIRNAME, ResolvedSource
from ..io.remote.listing import is_url, remote_index_path
from .checking import IndexProblem

__all__ = [
    "ARRAY_NAME",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SAMPLES_DTYPE",
    "SPAN_ARRAYS",
    "default_index_path",
    "is_older",
    "open_index_file",
    "read_header",
]

FORMAT_NAME = "pickleshard-index"
# 3: a checksum per array (and the whole index validated on open)
# 4: a span file's decoded size counts its object fields as decoded (sampled), not as pickled
#    bytes (which undercount small Python objects 4-5x and let the whole-file cache overrun);
#    older ones are rebuilt
# 5: layout="auto" reads what the producer meant (pickleshard.scan.defaults: appended records of
#    small arrays, one sample per file) and the header records the samples' form
#    ("sample_form": "tuple" or "dict", pickleshard.scan.sampleform); older indexes read some
#    files another way and hand out tuples where the producer wrote dicts: rebuilt
FORMAT_VERSION = 5

# The span arrays of the index, each concatenated over the span-indexed files in file order.
SPAN_ARRAYS = ("starts", "ends", "memo_base", "ext_offsets", "ext_keys", "records")
SAMPLES_DTYPE = np.dtype([("file", "<u4"), ("item", "<u4")])

# a file of the index directory: a plain name, never a path (``pickleshard index`` deletes the
# arrays an old header names, so a name must never reach outside that directory)
ARRAY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\.npy")

_ADVICE = "; rebuild it with `pickleshard index` or rebuild='auto'"


def default_index_path(source: ResolvedSource) -> Path:
    """``DIR/.pickleshard`` for a directory; for a glob or file list, a subfolder keyed by the list."""
    if is_url(source.root):  # kept locally, keyed by the URL
        return remote_index_path(source)
    base = source.root / INDEX_DIRNAME
    if source.is_directory:
        return base
    key = hashlib.blake2b("\n".join(source.files).encode(), digest_size=6).hexdigest()
    return base / f"files-{key}"


def is_older(version: object) -> bool:
    """Whether a header's ``version`` is one an older pickleshard wrote (rebuilt, not refused)."""
    return isinstance(version, int) and version < FORMAT_VERSION


def open_index_file(path: Path) -> tuple[IO[bytes], os.stat_result]:
    """Open ``path``, a file of an index directory, for reading, with its ``fstat``.

    ``O_NONBLOCK``: a FIFO planted under an index file's name must not hang the open (on a
    regular file the flag changes nothing). Raises the ``OSError`` of the open, or
    :class:`~pickleshard.index.checking.IndexProblem` ``(path.name, "is not a regular file")``
    when it is a FIFO, a device or a directory; the caller closes the returned file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    fh = open(fd, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IndexProblem(path.name, "is not a regular file")
    except BaseException:
        fh.close()
        raise
    return fh, st


def read_header(where: Path) -> dict[str, Any]:
    """The parsed ``index.json`` of index directory ``where``; raises IndexFormatError when
    it is missing, not a regular file (a FIFO must not hang the open), not JSON (or nested
    too deeply for the parser), or not a JSON object."""
    path = where / "index.json"
    try:
        fh, _ = open_index_file(path)
    except FileNotFoundError:
        raise IndexFormatError(where, "no index.json; build one with `pickleshard index`") from None
    except OSError as exc:
        raise IndexFormatError(path, f"cannot read: {exc.strerror or exc}{_ADVICE}") from None
    except IndexProblem as exc:
        raise IndexFormatError(path, f"{exc.what}{_ADVICE}") from None
    with fh:
        try:
            header = json.loads(fh.read())
        except (OSError, ValueError, RecursionError) as exc:
            what = "nested too deeply" if isinstance(exc, RecursionError) else exc
            raise IndexFormatError(path, f"cannot read: {what}{_ADVICE}") from None
    if not isinstance(header, dict):
        raise IndexFormatError(path, f"is not a JSON object{_ADVICE}")
    return header
