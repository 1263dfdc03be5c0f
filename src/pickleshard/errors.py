"""The one exception hierarchy of pickleshard.

Every error raised on bad input derives from :class:`PickleshardError` and also from the builtin
that matches it (``FileNotFoundError``, ``ValueError``, ``OSError``), so ``except ValueError``
still works for callers that know nothing of pickleshard. Each message starts with the file it is
about and says what was expected there.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable

__all__ = [
    "AlreadyRegisteredError",
    "ClusterError",
    "ClusterUnreachableError",
    "ConversionStateError",
    "ConvertedDatasetError",
    "CorruptPickleError",
    "DatasetNotFoundError",
    "DecompressedTooLargeError",
    "EmptyPickleError",
    "FieldLengthMismatchError",
    "FileChangedError",
    "IndexFormatError",
    "MemoIdError",
    "MissingDependencyError",
    "NoPickleFilesError",
    "NotAPickleError",
    "NotRegularFileError",
    "NotSpanIndexableError",
    "OutputExistsError",
    "OutputPathError",
    "OutputSpaceError",
    "PickleshardError",
    "ReadMemoryError",
    "RemoteStorageError",
    "SampleLimitError",
    "SampleTooDeepError",
    "SampleTooLargeError",
    "StaleIndexError",
    "TextEncodingError",
    "TruncatedPickleError",
    "UnencodableValueError",
    "UnreadableFileError",
    "UnsafePickleError",
    "UnsupportedLayoutError",
    "VerifyMismatchError",
]


def _where(path: str | os.PathLike[str], offset: int | None, sample: int | None) -> str:
    where = os.fspath(path)
    if offset is not None:
        where += f" at byte {offset}"
    if sample is not None:
        where += f" (sample {sample})"
    return where


class PickleshardError(Exception):
    """Root of every error pickleshard raises on bad input or bad state."""


class FileProblem(PickleshardError):
    """An error about one file; ``path``, ``offset`` and ``sample`` say where.

    ``FileProblem(text)`` with the one argument alone takes ``text`` as the whole message (the
    path unknown): how ``torch.utils.data`` re-raises a DataLoader worker's error in the main
    process (``exc_type(msg)``), which must keep the class, not turn it into a RuntimeError.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        message: str | None = None,
        *,
        offset: int | None = None,
        sample: int | None = None,
    ) -> None:
        self.offset = offset
        self.sample = sample
        if message is None:  # the one-argument form: a complete message
            self.path = ""
            super().__init__(os.fspath(path))
            return
        self.path = os.fspath(path)
        super().__init__(f"{_where(path, offset, sample)}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross process boundaries (index workers): keep the keyword arguments, and the
        # attributes a subclass adds (NotSpanIndexableError's reason).
        extra = {k: v for k, v in vars(self).items() if k not in ("path", "offset", "sample")}
        return (_rebuild, (type(self), self.args[0], self.path, self.offset, self.sample, extra))


def _rebuild(
    cls: type[FileProblem],
    text: str,
    path: str,
    offset: int | None,
    sample: int | None,
    extra: dict[str, object] | None = None,
) -> FileProblem:
    err = cls.__new__(cls)
    Exception.__init__(err, text)
    err.path, err.offset, err.sample = path, offset, sample
    if extra:
        vars(err).update(extra)
    return err


class DatasetNotFoundError(PickleshardError, FileNotFoundError):
    """The dataset source (directory, glob or file) does not exist."""

    def __init__(self, source: str | os.PathLike[str], what: str = "directory") -> None:
        self.path = os.fspath(source)
        self.what = what
        super().__init__(f"{self.path}: no such {what}; expected a directory of pickle files")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.what))


class NoPickleFilesError(PickleshardError, FileNotFoundError):
    """The source exists but holds no pickle files."""

    def __init__(
        self, source: str | os.PathLike[str], patterns: Iterable[str], found: str = ""
    ) -> None:
        self.path = os.fspath(source)
        self.patterns = tuple(patterns)
        self.found = found  # what the directory holds instead, and what to pass (sources.py)
        super().__init__(
            f"{self.path}: no pickle files found; expected files matching "
            + ", ".join(self.patterns)
            + (f"; {found}" if found else "")
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.patterns, self.found))


class UnreadableFileError(FileProblem, OSError):
    """The file exists but cannot be opened or read (permissions, I/O error, a directory)."""


class RemoteStorageError(UnreadableFileError):
    """Remote storage refused a request (credentials, permissions) or still failed it after
    its retries; the message names the URL and, for a read, the byte range."""


class NotRegularFileError(UnreadableFileError):
    """A data file is a FIFO, a device, a socket or a directory: only regular files are read.

    Refused from its ``os.stat``, before anything opens it (opening a FIFO blocks, and a device
    such as ``/dev/zero`` never ends).
    """


class CorruptPickleError(FileProblem, ValueError):
    """The bytes are not a valid pickle stream of the kind expected."""


class DecompressedTooLargeError(FileProblem, ValueError):
    """A compressed file without seek points decompresses to more than its copy's byte budget."""


class EmptyPickleError(CorruptPickleError):
    """The file has zero bytes."""


class NotAPickleError(CorruptPickleError):
    """The file does not start with a pickle opcode stream (text, zip, noise...)."""


class TextEncodingError(CorruptPickleError):
    """A ``str`` in the pickle does not decode with the ``encoding`` given (``"ASCII"`` by
    default): the file was written by Python 2, whose ``str`` is bytes."""


class TruncatedPickleError(CorruptPickleError):
    """The pickle stream ends before its STOP opcode or inside a payload."""


class MemoIdError(CorruptPickleError):
    """A span names a memo id that its own bytes cannot have defined (a span of ``L`` bytes
    defines at most ``L``): the data file and its index do not belong together (a crafted file
    or index). Refused before the unpickler would grow its memo to that id."""


class UnsupportedLayoutError(FileProblem, ValueError):
    """The file unpickles, but its top-level object is not a layout pickleshard can index."""


class FieldLengthMismatchError(UnsupportedLayoutError):
    """A columns layout whose fields have different lengths, e.g. ``len(x) != len(y)``."""


class UnsafePickleError(FileProblem, pickle.UnpicklingError):
    """The pickle references a global outside the allowlist (or uses an allowlisted one in a way
    the allowlist refuses). Also a :class:`pickle.UnpicklingError`: what a restricted
    ``find_class`` raises in the :mod:`pickle` documentation, and what
    ``torch.load(weights_only=True)`` raises for the same refusal."""


class StaleIndexError(PickleshardError, ValueError):
    """The index no longer describes the files on disk (a ``ValueError``, like
    :class:`FileChangedError`, its subclass for a file that changed under a read)."""

    def __init__(
        self,
        index_path: str | os.PathLike[str],
        *,
        changed: Iterable[str] = (),
        removed: Iterable[str] = (),
        added: Iterable[str] = (),
        relinked: Iterable[str] = (),
    ) -> None:
        self.path = os.fspath(index_path)
        self.changed = tuple(changed)
        self.removed = tuple(removed)
        self.added = tuple(added)
        # changed files whose size, mtime and sampled bytes are the same: copies (new inode)
        # or files whose metadata changed (new ctime)
        self.relinked = tuple(relinked)
        parts = []
        for label, names in (
            ("changed", self.changed),
            ("removed", self.removed),
            ("added", self.added),
        ):
            if names:
                shown = ", ".join(names[:10]) + (
                    f" and {len(names) - 10} more" if len(names) > 10 else ""
                )
                parts.append(f"{label}: {shown}")
        note = ""
        if self.relinked:
            what = "all" if len(self.relinked) == len(self.changed) else str(len(self.relinked))
            note = (
                f" ({what} of the changed files have the same size, mtime and sampled bytes but a "
                "new inode or ctime: a copied dataset, or a file rewritten in place)"
            )
        super().__init__(
            f"{self.path}: index is stale ({'; '.join(parts)}){note}; "
            "rebuild it with `pickleshard index` or pass rebuild='auto'"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_stale,
            (self.path, self.changed, self.removed, self.added, self.relinked),
        )


def _rebuild_stale(
    path: str,
    changed: tuple[str, ...],
    removed: tuple[str, ...],
    added: tuple[str, ...],
    relinked: tuple[str, ...] = (),
) -> StaleIndexError:
    return StaleIndexError(path, changed=changed, removed=removed, added=added, relinked=relinked)


class FileChangedError(StaleIndexError, CorruptPickleError):
    """A data file changed while (or before) it was read: the bytes or the identity (size,
    mtime, ctime, inode) a read relies on are not those the index recorded, so what it read may
    be neither the old data nor the new. Both a :class:`StaleIndexError` (the index no longer
    describes the file; ``changed`` names it) and a :class:`CorruptPickleError` (``path`` is the
    data file, ``offset`` and ``sample`` say where). ``FileChangedError(text)`` alone (how a
    DataLoader rebuilds a worker's error in the main process) keeps ``text`` as the message."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        what: str | None = None,
        *,
        offset: int | None = None,
        sample: int | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.offset, self.sample = offset, sample
        self.changed, self.removed, self.added, self.relinked = (self.path,), (), (), ()
        text = self.path
        if what is not None:
            text = (
                f"{_where(path, offset, sample)}: {what}: the file changed since it was indexed; "
                "rebuild the index with `pickleshard index` or pass rebuild='auto'"
            )
        Exception.__init__(self, text)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.args[0],), self.__dict__.copy())


class ReadMemoryError(FileProblem, MemoryError):
    """Memory ran out while reading a sample (the sample, or what it decodes to, is too big for
    the memory left); not a sign of a damaged file."""

    def __reduce__(self) -> tuple[object, ...]:
        # MemoryError's own __new__ refuses the bare allocation _rebuild does: construct it,
        # then BaseException.__setstate__ sets the attributes (args: the message) back
        state = {"path": self.path, "offset": self.offset, "sample": self.sample}
        return (type(self), (self.path, ""), {**state, "args": self.args})


class IndexFormatError(PickleshardError, ValueError):
    """An index directory exists but cannot be read (unknown version, missing arrays)."""

    def __init__(self, index_path: str | os.PathLike[str], message: str | None = None) -> None:
        if message is None:  # the one-argument form (see FileProblem): a complete message
            self.path, self.message = "", os.fspath(index_path)
            super().__init__(self.message)
            return
        self.path = os.fspath(index_path)
        self.message = message
        super().__init__(f"{self.path}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.message) if self.path else (self.message,))


# Conversion to memmap / LMDB / WebDataset, converted datasets, and verification.


class OutputPathError(FileProblem, OSError):
    """A conversion's output path cannot be created or written (permissions, a file in the way)."""


class OutputSpaceError(OutputPathError):
    """The output's file system filled up (``ENOSPC``, ``EDQUOT``) while a conversion or split
    wrote it; what was finished is kept, and the same command, rerun, resumes from there.
    ``errno`` is the one the write failed with."""


class OutputExistsError(FileProblem, FileExistsError):
    """The output path holds something other than this conversion's finished output."""


class ConversionStateError(FileProblem, ValueError):
    """Another conversion to the same output is running (it holds the staging directory's lock)."""


class ConvertedDatasetError(FileProblem, ValueError):
    """A converted dataset cannot be read: no descriptor, unknown format, missing arrays, bad values."""


class UnencodableValueError(FileProblem, TypeError):
    """A sample holds a value the safe (pickle-free) encoding cannot store, e.g. a class instance."""


class VerifyMismatchError(FileProblem, ValueError):
    """A converted sample differs from its source; ``sample`` is the first one found."""


class AlreadyRegisteredError(PickleshardError, ValueError):
    """A registry (formats, byte sources, allowlist presets) already holds another entry under
    ``name``: an entry is replaced only on purpose, by registering again with ``clobber=True``."""

    def __init__(self, kind: str, name: str, held: str) -> None:
        self.kind = kind
        self.name = name
        self.held = held
        super().__init__(
            f"{kind} {name!r} is already registered as {held}; pass clobber=True to replace it"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.kind, self.name, self.held))


class MissingDependencyError(PickleshardError, ImportError):
    """An optional backend is not installed; the message names the extra that provides it."""

    def __init__(self, package: str, extra: str, purpose: str, path: str | None = None) -> None:
        self.package, self.extra, self.purpose = package, extra, purpose
        where = f"{path}: " if path else ""
        super().__init__(
            f"{where}{purpose} needs the {package!r} package: pip install 'pickleshard[{extra}]'",
            path=path,  # ImportError's own attribute: the file that needs the package
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.package, self.extra, self.purpose, self.path))


class NotSpanIndexableError(FileProblem, ValueError):
    """The file is a valid pickle, but its samples cannot be read span by span (a
    ``ValueError``, like :class:`UnsupportedLayoutError`).

    Not a defect of the file: ``reason`` says, for a person, what the scanner could not prove
    correct (protocol 0/1, a persistent id, a memo reference it cannot resolve, a layout it does
    not recognise...), and the caller falls back to whole-file mode.
    """

    def __init__(
        self, path: str | os.PathLike[str], reason: str | None = None, *, offset: int | None = None
    ) -> None:
        if reason is None:  # the one-argument form (see FileProblem): a complete message
            self.reason = ""
            super().__init__(path, offset=offset)
            return
        self.reason = reason
        super().__init__(path, f"cannot read samples in place: {reason}", offset=offset)


class SampleLimitError(FileProblem, ValueError):
    """A sample exceeds a bound of the reader (``max_sample_bytes``, ``max_depth``): refused
    where it is handed out, before it is collated, converted or sent between processes."""


class SampleTooLargeError(SampleLimitError):
    """A sample decodes to more than ``max_sample_bytes`` (counted as a tree: each reference
    to a shared object counts it again, as a collate or a conversion would copy it)."""


class SampleTooDeepError(SampleLimitError):
    """A sample nests containers deeper than ``max_depth`` (or contains itself): pickling it
    again, collating or converting it would exhaust the recursion limit."""


class BoundExceeded(Exception):
    """Internal: a sample's walk passed a bound (``what``: bytes, depth or cycle; ``value``: how
    far it got), turned into a :class:`SampleLimitError` naming the file and sample before any
    caller sees it. Here, at the bottom, so that the compiled core can raise it too."""

    def __init__(self, what: str, value: int) -> None:
        super().__init__(what, value)
        self.what, self.value = what, value


class ClusterError(PickleshardError, RuntimeError):
    """The Dask cluster at ``address`` could not run the work (its message says why)."""

    def __init__(self, address: str, message: str) -> None:
        self.address = address
        self.detail = message
        super().__init__(f"Dask cluster {address}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.address, self.detail))


class ClusterUnreachableError(ClusterError, ConnectionError):
    """No Dask scheduler answers at ``address`` (or it has no workers)."""
