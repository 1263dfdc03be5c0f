"""One audit, up front: every global a dataset's files need that the policy refuses, at once.

:func:`audit_source` runs when a :class:`~pickleshard.PickleDataset` opens (and so when
``convert`` opens its source), before the index is built or any sample is read: each file's
globals are listed from its opcodes (:func:`pickleshard.safety.audit.files.audit_buffer`, nothing
imported or run; a ``joblib.dump`` file's pickle part by :mod:`.joblibfile`'s walk), and every
global that neither the allowlist, ``allow_globals`` nor an ``allow`` preset admits is reported
in one :class:`~pickleshard.errors.UnsafePickleError`, with the number of files that need it
and what to pass: the preset of a known producer (pandas, dill, PIL, scipy.sparse), else
``allow_globals`` naming each (never for a global whose only use is running code), or
``trusted=True``. Without it the first refusal came at the first ``ds[i]``, or inside a
DataLoader worker, one global per error.

Each file's list is kept in ``audit.json`` in the index directory, keyed by the file's size,
mtime and inode, so reopening a dataset walks only the files that changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import UnsafePickleError
from ..executors import local_executor
from ..index.ondisk import default_index_path
from ..io import open_reader, open_source
from ..io.atomic import write_bytes_atomic
from ..io.listing import ResolvedSource, resolve_source
from ..io.options import SourceOptions
from ..producers.joblibfile import WRAPPER, _Structure, joblib_kind
from ..safety.allowlist import PRESETS, classify_global
from ..safety.audit.files import audit_buffer
from ..safety.policy import UnpicklePolicy
from ..scan.access import choose_pattern
from ..scan.sparse import sparse_buffer

__all__ = ["CACHE_NAME", "audit_source", "file_globals", "refusal_message"]

CACHE_NAME = "audit.json"
AUDIT_OPCODE_BYTES = 8 << 20
"""Files with more opcode bytes than this are not walked (the walk is Python, about 1.4 us an
opcode: 8 MiB of dense opcodes is a few seconds); their refusals come at the read that meets
them. Opcode bytes: what the index scan examined, for a file read by span (payloads are
skipped); the file's size otherwise."""
_CACHE_VERSION = 2
GlobalKey = tuple[str, str]

_KNOWN: dict[str, str] = {
    "pandas": "a pickled pandas DataFrame/Series: allow='pandas' reads one sample per row",
    "dill": "dill writes numpy arrays through dill._dill._create_array: allow='dill' reads them",
    "pil": "PIL images: allow='pil' loads them (convert writes them as uint8 arrays)",
    "scipy.sparse": (
        "scipy sparse matrices: allow='scipy.sparse' loads them (convert writes them as "
        "(data, indices, indptr, shape))"
    ),
}


class _Refused:
    """What the joblib walk gets for a refused global while auditing: inert, so the walk goes
    on and finds the others (a call or BUILD on it does nothing)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


def _joblib_globals(
    source: Any, where: str, kind: str, policy: UnpicklePolicy
) -> dict[GlobalKey, int]:
    """The globals a joblib file's pickle part names (the wrapper left out: the readers
    handle it), found by walking it with refused globals inert."""
    seen: set[GlobalKey] = set()
    allow = policy.find_class(where)

    def lookup(module: str, name: str) -> Any:
        seen.add((module, name))
        if allow is not None and classify_global(module, name, policy.allow_globals) == "allowed":
            return allow(module, name)
        return _Refused

    with open_reader(source) as raw:
        fh: Any = io.BufferedReader(raw, 1 << 16)
        size = source.size
        with contextlib.ExitStack() as stack:
            if kind != "joblib":
                try:
                    from joblib import numpy_pickle_utils
                except ImportError:  # the load says joblib is needed
                    return {}
                ctx = numpy_pickle_utils._validate_fileobject_and_memmap(fh, where)
                fh, _ = stack.enter_context(ctx)
                size = 1 << 62  # decompressed: no size to check data against
            with contextlib.suppress(Exception):  # damage: the load reports it
                _Structure(fh, where, size, lookup, policy.encoding).load()
    seen.discard(WRAPPER)
    return dict.fromkeys(seen, -1)


def file_globals(
    path: str | os.PathLike[str], policy: UnpicklePolicy, options: SourceOptions | None = None
) -> dict[GlobalKey, int]:
    """Every global the file at ``path`` (opened with ``options``) names, by its opcodes, with
    the offset of the first opcode naming it (-1: not known); empty for a file the audit cannot
    walk (not a pickle, damaged: the index build names what is wrong)."""
    where = os.fspath(path)
    try:
        with open_source(where, options) as source:
            kind = joblib_kind(source)
            if kind:
                return _joblib_globals(source, where, kind, policy)
            # read as the scan reads: only the bytes examined reach storage (a normally advised
            # map of a sparse file reads ahead 8 MiB around each fault; a remote one is fetched
            # by ranges), so the scan that follows finds them in the page cache
            buf = None
            if source.fileno() is not None:
                source.advise(choose_pattern(source))
                buf = source.map()
            if buf is None:
                buf = sparse_buffer(source)
            return buffer_globals(buf, source.size, where)
    except Exception:  # best effort: the reads enforce the policy and word every error
        return {}


def buffer_globals(buf: Any, size: int, where: str) -> dict[GlobalKey, int]:
    """:func:`file_globals` of a pickle file already in ``buf[:size]`` (a plain pickle, not a
    joblib file): raises what the walk raises."""
    audit = audit_buffer(buf, size, where)
    # a nested torch payload's globals are torch's weights_only loader's business
    return {k: audit.first_refs.get(k, -1) for k in audit.refs if k[0] != "?"}


def remember_globals(
    index_dir: Path, found: dict[str, tuple[list[int], dict[GlobalKey, int]]]
) -> None:
    """Keep in ``audit.json`` the globals the index build found while it scanned (``{rel:
    (stamp, globals)}``, stamp as :func:`_stamp` gives it), so that the audit of the dataset it
    opens walks none of those files again."""
    if not found:
        return
    path = index_dir / CACHE_NAME
    cache = _load_cache(path)
    for rel, (stamp, keys) in found.items():
        cache[rel] = [*stamp, sorted([m, n, at] for (m, n), at in keys.items())]
    _save_cache(path, cache)


def _load_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != _CACHE_VERSION:
        return {}
    files = data.get("files")
    return files if isinstance(files, dict) else {}


def _save_cache(path: Path, files: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # a read-only dataset: audited again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, json.dumps({"version": _CACHE_VERSION, "files": files}).encode())


def _stamp(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _entry(got: Any) -> dict[GlobalKey, int] | None:
    """A cached file's globals, or None for an entry that is not what this version writes (the
    cache is ours, but a damaged or older one is walked again, never trusted)."""
    if not (isinstance(got, list) and len(got) == 4 and isinstance(got[3], list)):
        return None
    out: dict[GlobalKey, int] = {}
    for g in got[3]:
        if not (isinstance(g, list) and len(g) == 3 and all(type(x) is str for x in g[:2])):
            return None
        if type(g[2]) is not int:
            return None
        out[(g[0], g[1])] = g[2]
    return out


def _cached_globals(
    resolved: ResolvedSource, index_dir: Path, policy: UnpicklePolicy, jobs: int | None
) -> dict[str, dict[GlobalKey, int]]:
    cache_path = index_dir / CACHE_NAME
    cache = _load_cache(cache_path)
    out: dict[str, dict[GlobalKey, int]] = {}
    stamps = {rel: _stamp(resolved.absolute(rel)) for rel in resolved.files}
    walk = []
    for rel, stamp in stamps.items():
        got = cache.get(rel)
        kept = _entry(got) if stamp is not None and got is not None else None
        if kept is not None and isinstance(got, list) and got[:3] == stamp:
            out[rel] = kept
        else:
            walk.append(rel)
    # the walk is Python (about 1.4 us an opcode): files in parallel, as the index build does
    n_jobs = jobs if jobs is not None else min(os.cpu_count() or 1, 8)
    tasks = [(os.fspath(resolved.absolute(rel)), policy, resolved.options) for rel in walk]
    for k, keys in local_executor(n_jobs, len(tasks)).run(file_globals, tasks):
        out[walk[k]] = keys
    fresh: dict[str, Any] = {}
    for rel, stamp in stamps.items():
        keys = out[rel]
        fresh[rel] = [*(stamp or [-1, -1, -1]), sorted([m, n, at] for (m, n), at in keys.items())]
    if fresh != cache:
        _save_cache(cache_path, fresh)
    return out


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def refusal_message(refused: dict[GlobalKey, list[str]], n_files: int) -> str:
    """The text of the up-front refusal: each global with its file count, and what to pass."""
    needing = sorted({f for files in refused.values() for f in files})
    order = sorted(refused, key=lambda k: (-len(refused[k]), k))
    listed = ", ".join(
        f"{m}.{n} ({classify_global(m, n)}) in {_files(len(refused[(m, n)]))}" for m, n in order
    )
    shown = ", ".join(needing[:3]) + (" ..." if len(needing) > 3 else "")
    hints = []
    presets = Counter(p for k in refused for p, names in PRESETS.items() if k in names)
    for p in presets:
        hints.append(f"{_KNOWN.get(p, f'allow={p!r}')} (CLI: --allow {p})")
    rest = [k for k in order if not any(k in names for names in PRESETS.values())]
    dangerous = [k for k in rest if classify_global(*k) == "dangerous"]
    plain = [k for k in rest if k not in dangerous]
    if plain:
        names = ", ".join(f"'{m}.{n}'" for m, n in plain)
        flags = " ".join(f"--allow-global {m}.{n}" for m, n in plain)
        hints.append(
            f"allow_globals=[{names}] (CLI: {flags}) admits "
            + ("it" if len(plain) == 1 else "them")
            + ", trusting every file that uses "
            + ("it" if len(plain) == 1 else "them")
        )
    if dangerous:
        names = ", ".join(f"{m}.{n}" for m, n in dangerous)
        hints.append(f"{names}: only ever used to run code: load only files you wrote")
    hints.append("trusted=True (CLI: --trusted) loads everything, if you trust every file")
    # the fix first: the list of globals can run to hundreds of characters
    return (
        f"{len(needing)} of {n_files} file(s) need globals the allowlist refuses. What to pass: "
        + "; ".join(hints)
        + f". The globals (found by reading opcodes; nothing was loaded): {listed}; e.g. {shown}"
    )


def audit_source(
    resolved: ResolvedSource, index_dir: Path, policy: UnpicklePolicy, jobs: int | None = None
) -> dict[GlobalKey, list[str]]:
    """Raise one :class:`UnsafePickleError` naming every global the files of ``resolved``
    need that ``policy`` refuses (with file counts and what to pass); returns the (empty)
    refusals otherwise. Nothing is checked when ``policy.trusted``. Files not walked before
    (or changed since) are walked in at most ``jobs`` processes (default: CPUs, at most 8)."""
    if policy.trusted:
        return {}
    per_file = _cached_globals(resolved, index_dir, policy, jobs)
    refused: dict[GlobalKey, list[str]] = {}
    first: tuple[str, int] | None = None  # the file (and offset) the error is about
    for rel, keys in per_file.items():
        for key, at in sorted(keys.items(), key=lambda kv: kv[1]):
            if classify_global(*key, policy.allow_globals) != "allowed":
                refused.setdefault(key, []).append(rel)
                first = first or (rel, at)
    if first is not None:
        rel, at = first
        raise UnsafePickleError(
            resolved.absolute(rel),
            refusal_message(refused, len(per_file)),
            offset=at if at >= 0 else None,
        )
    return refused


def audit_opened(
    index: Any, source: ResolvedSource, policy: UnpicklePolicy, jobs: int | None = None
) -> None:
    """:func:`audit_source` over the files an opened index holds (a
    :class:`~pickleshard.index.DatasetIndex` of ``source``): files the build refused or
    skipped are never walked (a pathological file costs the build's refusal, not a walk), nor
    are remote objects (an index row with an ETag): walking them would fetch their opcodes a
    second time, so their refusals come at the read that meets them, as before this audit."""
    if policy.trusted:
        return
    files = tuple(
        f.path
        for f in index.files
        if int((f.scan or {}).get("bytes_read", f.size) if f.mode == "span" else f.size)
        <= AUDIT_OPCODE_BYTES
        and f.etag is None  # a remote object: its opcodes would be fetched a second time
    )
    audit_source(dataclasses.replace(source, files=files), Path(index.path), policy, jobs)


def audit_dataset_source(
    source: Any,
    index: str | os.PathLike[str] | None,
    policy: UnpicklePolicy,
    jobs: int | None = None,
    options: SourceOptions | None = None,
) -> None:
    """:func:`audit_source` for what :class:`~pickleshard.PickleDataset` takes (``source``,
    ``index``, its ``options``): the call dataset opening makes when building its index met a refusal, so that
    the error names every refused global, not the first."""
    if policy.trusted:
        return
    resolved = resolve_source(source, options)
    index_dir = Path(index) if index is not None else default_index_path(resolved)
    small = tuple(f for f in resolved.files if _size(resolved.absolute(f)) <= AUDIT_OPCODE_BYTES)
    audit_source(dataclasses.replace(resolved, files=small), index_dir, policy, jobs)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
