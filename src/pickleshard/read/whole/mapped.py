"""Whole files shared with DataLoader workers: decoded once into a memory-mapped cache entry.

A file that must be unpickled whole costs its decoded size in *every* process that loads it:
each DataLoader worker has its own :class:`~pickleshard.read.whole.cache.WholeFileCache`, so two
workers hold two copies (and decode twice, at once). Inside a worker, :class:`MappedWholeFiles`
instead makes the first process that needs a file decode it once (the others wait on a lock),
write its columns into a cache entry under the index directory, drop the decoded objects, and
map the entry read-only; every worker then reads the same page-cache pages, which the kernel
shares among them and may reclaim (they are clean file pages, not anonymous memory).

An entry is a directory ``<index>/whole/<path hash>-<identity hash>/`` holding ``meta.json`` and
one or two files per column, by what the column holds:

============  ============================================  ===============================
kind          column                                        ``col[i]``
============  ============================================  ===============================
``array``     an ndarray without object fields: ``.npy``    ``a[i]``, an ndarray row copied
``stacked``   a list of C-contiguous ndarrays, one dtype    ``a[i]`` copied (a private,
              and shape: one ``.npy`` of them stacked       writable array, as pickle.load's)
``ints``      a list of exact ``int`` within int64          ``int(a[i])``
``pickled``   anything else: each element pickled alone,    the element unpickled under the
              a ``.bin`` blob and ``.offsets.npy``          dataset's policy (its allowlist)
============  ============================================  ===============================

So nothing per sample is a Python object in a worker, whatever the file holds. The entry is
named by the file's identity as the index recorded it (size, mtime, ctime, inode); entries of
older identities of the same path are removed when a new one is written. Every time a process
starts using an entry (a miss in its :class:`~pickleshard.read.whole.cache.WholeFileCache`) the data
file's identity is compared with the index's first: a file changed since it was indexed raises
:class:`~pickleshard.errors.FileChangedError`, as a whole-file load does. The entry itself is
checked against the index (sample count, fields, offsets) when mapped: it is ours, but it sits
on disk beside the index and is treated as the index is.

Budget: the worker's cache counts an entry at its decoded size, as it counts a decoded file, so
``cache_bytes`` bounds what each worker maps; pages mapped by several workers are counted once
by the kernel (PSS divides them). Disk: entries take about the decoded size of the files read
whole; delete ``<index>/whole`` at any time to reclaim it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import shutil
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import FileChangedError, IndexFormatError
from ...io import open_source
from ...io.identity import FileIdentity
from ...io.options import SourceOptions
from ...safety.policy import UnpicklePolicy
from ...scan.layouts import DecodedLayout

if TYPE_CHECKING:
    from ...index import DatasetIndex

__all__ = ["ENTRY_VERSION", "MappedWholeFiles", "in_worker", "whole_loader", "write_entry"]

ENTRY_VERSION = 1
_INT64 = (-(1 << 63), (1 << 63) - 1)


def in_worker() -> bool:
    """Whether this process is a DataLoader worker (torch looked up only if already imported)."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


# -- writing -------------------------------------------------------------------------------------


def _stackable(col: Sequence[Any]) -> np.ndarray | None:
    """The first element when every element of ``col`` is a C-contiguous ndarray (ndim >= 1,
    no object fields) of one dtype and shape, else None."""
    first = col[0] if len(col) else None
    if type(first) is not np.ndarray or first.ndim == 0 or first.dtype.hasobject:
        return None
    dtype, shape = first.dtype, first.shape
    for v in col:
        if type(v) is not np.ndarray or v.dtype != dtype or v.shape != shape:
            return None
        if not v.flags.c_contiguous:
            return None
    return first


def _write_stacked(path: Path, col: Sequence[np.ndarray], first: np.ndarray) -> None:
    # row by row: stacking in memory first would double the decode's peak
    header: dict[str, Any] = {
        "descr": np.lib.format.dtype_to_descr(first.dtype),
        "fortran_order": False,
        "shape": (len(col), *first.shape),
    }
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_2_0(fh, header)
        for v in col:
            fh.write(v.data.cast("B"))


def _write_ints(path: Path, col: Sequence[Any]) -> bool:
    lo, hi = _INT64
    if not all(type(v) is int and lo <= v <= hi for v in col):
        return False
    np.save(path, np.fromiter(col, dtype=np.int64, count=len(col)))
    return True


def _write_pickled(base: Path, col: Sequence[Any]) -> None:
    offsets = np.empty(len(col) + 1, dtype=np.int64)
    offsets[0] = 0
    at = 0
    with open(base.with_suffix(".bin"), "wb") as fh:
        for k, v in enumerate(col):
            blob = pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
            fh.write(blob)
            at += len(blob)
            offsets[k + 1] = at
    np.save(base.with_suffix(".offsets.npy"), offsets)


def write_entry(directory: Path, decoded: DecodedLayout, identity: FileIdentity) -> None:
    """Write ``decoded`` (the columns of a file whose identity is ``identity``) as an entry in
    the new directory ``directory`` (see the module docstring for the kinds)."""
    directory.mkdir()
    kinds: list[str] = []
    for k, col in enumerate(decoded.columns):
        base = directory / f"c{k}"
        if isinstance(col, np.ndarray) and col.ndim >= 1 and not col.dtype.hasobject:
            np.save(base.with_suffix(".npy"), np.asarray(col))
            kinds.append("array")
        elif (first := _stackable(col)) is not None:
            _write_stacked(base.with_suffix(".npy"), col, first)
            kinds.append("stacked")
        elif not isinstance(col, np.ndarray) and _write_ints(base.with_suffix(".npy"), col):
            kinds.append("ints")
        else:
            _write_pickled(base, col)
            kinds.append("pickled")
    meta = {
        "version": ENTRY_VERSION,
        "identity": [identity.size, identity.mtime_ns, identity.ctime_ns, identity.ino],
        "layout": decoded.layout,
        "fields": list(decoded.fields),
        "num_samples": decoded.num_samples,
        "kinds": kinds,
    }
    (directory / "meta.json").write_text(json.dumps(meta))


# -- reading -------------------------------------------------------------------------------------


class MappedRows:
    """An ``array`` or ``stacked`` column: ``self[i]`` is row ``i`` of the mapped array, copied
    (a private, writable array; a numpy scalar for a 1-D column)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array  # read-only, over the entry's mapped .npy

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> Any:
        v = self.array[i]
        return v.copy() if isinstance(v, np.ndarray) else v


class MappedInts(MappedRows):
    """An ``ints`` column: ``self[i]`` is a Python ``int``."""

    __slots__ = ()

    def __getitem__(self, i: int) -> Any:
        return int(self.array[i])


class MappedPickled:
    """A ``pickled`` column: element ``i`` unpickled from its bytes under ``policy``."""

    __slots__ = ("blob", "offsets", "policy", "where")

    def __init__(
        self, blob: np.ndarray, offsets: np.ndarray, policy: UnpicklePolicy, where: str
    ) -> None:
        self.blob, self.offsets, self.policy, self.where = blob, offsets, policy, where

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Any:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        data = io.BytesIO(self.blob[a:b].tobytes())
        return self.policy.unpickler(data, self.where).load()


def _map_npy(path: Path) -> np.ndarray:
    array: np.ndarray = np.load(path, mmap_mode="r", allow_pickle=False)
    return array.view(np.ndarray)  # a plain read-only view; its base keeps the map alive


def _bad(entry: Path, why: str) -> IndexFormatError:
    return IndexFormatError(
        entry, f"whole-file cache entry {why}; delete {entry.parent} to rebuild"
    )


@dataclass(frozen=True)
class MappedEntry:
    """An opened entry: the identity of the file it was written from, and its columns."""

    identity: FileIdentity
    layout: DecodedLayout


def open_entry(entry: Path, policy: UnpicklePolicy, where: str) -> MappedEntry:
    """The columns of cache entry ``entry`` (of data file ``where``), mapped read-only;
    :class:`IndexFormatError` when its files do not fit together."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        n = int(meta["num_samples"])
        columns: list[Any] = []
        for k, kind in enumerate(meta["kinds"]):
            base = entry / f"c{k}"
            if kind == "pickled":
                offsets = _map_npy(base.with_suffix(".offsets.npy"))
                size = base.with_suffix(".bin").stat().st_size
                blob = (
                    np.memmap(base.with_suffix(".bin"), dtype=np.uint8, mode="r").view(np.ndarray)
                    if size
                    else np.zeros(0, np.uint8)
                )
                if (
                    offsets.dtype != np.int64
                    or offsets.shape != (n + 1,)
                    or offsets[0] != 0
                    or offsets[-1] != size
                    or np.any(np.diff(offsets) < 0)
                ):
                    raise _bad(entry, f"column {k} has offsets that do not fit its {size} bytes")
                columns.append(MappedPickled(blob, offsets, policy, where))
            elif kind in ("array", "stacked", "ints"):
                array = _map_npy(base.with_suffix(".npy"))
                if array.ndim == 0 or len(array) != n:
                    raise _bad(entry, f"column {k} holds {array.shape}, {n} samples expected")
                columns.append(MappedInts(array) if kind == "ints" else MappedRows(array))
            else:
                raise _bad(entry, f"column {k} has unknown kind {kind!r}")
        if meta["version"] != ENTRY_VERSION:
            raise _bad(entry, f"has version {meta['version']!r}, {ENTRY_VERSION} expected")
        layout = DecodedLayout(str(meta["layout"]), tuple(meta["fields"]), tuple(columns))
        return MappedEntry(FileIdentity(*meta["identity"]), layout)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, IndexFormatError):
            raise
        raise _bad(entry, f"cannot be read: {type(exc).__name__}: {exc}") from None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created): one process decodes a file, others wait."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock: two workers may both decode; rename decides
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class MappedWholeFiles:
    """Whole files of one dataset, decoded once into cache entries under ``directory`` and
    mapped (see the module docstring). ``decode(path)`` unpickles a file and checks it against
    the index (the dataset's own whole-file load); ``identity(path)`` is what the index
    recorded for it."""

    def __init__(
        self,
        directory: Path,
        policy: UnpicklePolicy,
        decode: Callable[[str], DecodedLayout],
        identity: Callable[[str], FileIdentity],
        check: Callable[[str, DecodedLayout], None],
        options: SourceOptions | None = None,
    ) -> None:
        self.directory = directory
        self.options = options  # what the data files are opened with (a URL's storage options)
        self.policy = policy
        self._decode = decode
        self._identity = identity
        self._check = check
        self.decoded = 0  # files this process decoded and wrote (a counter for tests, benches)
        self.mapped = 0  # entries this process mapped

    def entry_of(self, path: str) -> Path:
        """The entry directory for ``path`` as the index recorded it."""
        ident = self._identity(path)
        stamp = f"{ident.size}:{ident.mtime_ns}:{ident.ctime_ns}:{ident.ino}"
        return self.directory / f"{_digest(os.path.abspath(path))}-{_digest(stamp)}"

    def load(self, path: str) -> DecodedLayout:
        """The columns of data file ``path``, mapped from its entry (written first if missing);
        the dataset's own load (per process, unshared) when the directory is not writable."""
        recorded = self._identity(path)
        # a stat each time a process starts using the file
        with open_source(path, self.options) as source:
            what = source.changed_since(recorded)
        if what is not None:
            raise FileChangedError(path, what)
        entry = self.entry_of(path)
        if not (entry / "meta.json").exists():
            lock = entry.with_name(entry.name[:16] + ".lock")
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                lock.touch()
            except OSError as exc:  # a read-only index (EACCES, EROFS): decode here, unshared
                _warn(f"{self.directory}: cannot write the whole-file cache ({exc.strerror})")
                return self._decode(path)
            with _locked(lock):
                if not (entry / "meta.json").exists():
                    unshared = self._write(path, entry, recorded)
                    if unshared is not None:
                        return unshared
        decoded = open_entry(entry, self.policy, path)
        if decoded.identity != recorded:
            raise _bad(entry, f"was written for {decoded.identity}, the index records {recorded}")
        self._check(path, decoded.layout)
        self.mapped += 1
        return decoded.layout

    def _write(self, path: str, entry: Path, identity: FileIdentity) -> DecodedLayout | None:
        """Decode ``path`` and write its entry; None when written, else the decoded columns
        (an element that cannot be pickled again, nested past the recursion limit, or no room
        to write: this file stays unshared, decoded by each process that reads it)."""
        decoded = self._decode(path)
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        try:
            write_entry(tmp, decoded, identity)
        except (pickle.PicklingError, RecursionError, TypeError, AttributeError, OSError) as exc:
            # OSError: the disk is full or the directory went read-only
            _warn(f"{path}: not shared with other workers ({type(exc).__name__}: {exc})")
            shutil.rmtree(tmp, ignore_errors=True)
            return decoded
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        del decoded  # the decoded objects go before the entry is mapped
        try:
            for old in self.directory.glob(entry.name[:16] + "-*"):
                shutil.rmtree(old, ignore_errors=True)  # older identities of this path
            os.rename(tmp, entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.decoded += 1
        return None


def _warn(what: str) -> None:
    warnings.warn(
        f"{what}; each DataLoader worker decodes its own copy of this file",
        RuntimeWarning,
        stacklevel=4,
    )


def whole_loader(
    load: Callable[[str], DecodedLayout],
    index: DatasetIndex,
    positions: dict[str, int],
    policy: UnpicklePolicy,
    options: SourceOptions | None = None,
) -> Callable[[str], DecodedLayout]:
    """What a dataset's whole-file cache loads files with in this process: ``load`` (the
    dataset's own unpickle-and-check) in the main process, the mapped entries of
    ``<index>/whole`` in a DataLoader worker, where a copy per process would multiply (the
    data files opened with ``options``)."""
    if not in_worker():
        return load

    def identity(path: str) -> FileIdentity:
        return index.files[positions[path]].identity

    def check(path: str, decoded: DecodedLayout) -> None:
        index.check_decoded(positions[path], path, decoded.num_samples, decoded.fields)

    whole = Path(index.path) / "whole"
    return MappedWholeFiles(whole, policy, load, identity, check, options).load
