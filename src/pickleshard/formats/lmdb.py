"""LMDB: one key per field value, named as WebDataset members are, in plain encodings.

On disk::

    OUT/data.mdb          the LMDB environment (``lmdb.open("OUT", readonly=True, lock=False)``)
    OUT/pickleshard.json  descriptor (fields with their member stems)
    OUT/hashes.npy        uint8 (N, 16) content digests (see pickleshard.formats.base)

Sample ``i``'s field with stem ``x`` is the key ``f"{i:010d}.x.{ext}"`` (ASCII; fixed-width
decimal, so key order is sample order and a sample's keys are adjacent), its value the member
bytes of :mod:`pickleshard.formats.encoding`: ``npy`` (``np.load``), ``scalar.npy`` (a numpy
scalar: ``np.load(...)[()]``), ``cls`` (``int``), ``txt`` (UTF-8), ``json``, ``pickle``
(protocol 5). One more key, ``b"__pickleshard__"`` (after every sample key), holds the
descriptor's JSON (num_samples, fields). The docs (``docs/formats.md``) show a plain
``lmdb`` + ``numpy`` reader.

lmdb allows one open environment per file per process: this process's readers share one,
closed when the last reader goes (so a plain ``lmdb.open`` works again afterwards); while one is
open, :attr:`LmdbDataset.env` is the handle to read through. The map grows as needed while
writing (``MapFullError`` -> double and retry the batch). Needs ``pip install
'pickleshard[lmdb]'``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from ..errors import MissingDependencyError, OutputPathError
from ..io.handles import ProcessLocal
from ..safety import DEFAULT_POLICY, UnpicklePolicy
from .base import (
    ConvertedDataset,
    Format,
    PartResult,
    PartSpec,
    PartWriter,
    ReadOptions,
    Sample,
    WriteOptions,
    field_stems,
)
from .encoding import MemberKind, encode_member
from .files import NO_SPACE
from .registry import register_format

__all__ = ["LmdbDataset", "LmdbFormat", "member_key", "sample_prefix"]

META_KEY = b"__pickleshard__"
KEY_DIGITS = 10
_RECORD = struct.Struct("<HQ")  # a part file's record: key length, value length
_BATCH_BYTES = 32 << 20
_PAGE = 4096


def import_lmdb() -> ModuleType:
    """The ``lmdb`` module, or :class:`MissingDependencyError` with the install hint."""
    try:
        import lmdb
    except ImportError:
        raise MissingDependencyError("lmdb", "lmdb", "the LMDB format") from None
    return lmdb


def sample_prefix(i: int) -> bytes:
    """What every key of sample ``i`` starts with: ``b"0000000123."``."""
    return f"{i:0{KEY_DIGITS}d}.".encode()


def member_key(i: int, stem: str, kind: MemberKind) -> bytes:
    """The key of sample ``i``'s field ``stem`` holding a ``kind`` member: ``b"0000000123.x.npy"``."""
    return sample_prefix(i) + f"{stem}.{kind.ext}".encode()


class LmdbPartWriter(PartWriter):
    """Writes ``records.bin``: per field value, a key length, a value length, the key, the value
    (in key order: a sample's keys sorted, samples ascending)."""

    def __init__(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> None:
        super().__init__(part_dir, spec, options)
        self.fh: IO[bytes] = open(part_dir / "records.bin", "wb", 1 << 20)  # noqa: SIM115
        self.stems = field_stems(options.fields)
        self.count = 0
        self.nbytes = 0

    def write(self, index: int, sample: Sample) -> None:
        members = sorted(
            (member_key(index, stem, kind), data)
            for stem, (kind, data) in zip(
                self.stems, (encode_member(v) for v in sample), strict=True
            )
        )
        for key, data in members:
            self.fh.write(_RECORD.pack(len(key), len(data)))
            self.fh.write(key)
            self.fh.write(data)
            self.nbytes += len(key) + len(data)
        self.count += 1

    def close(self) -> dict[str, Any]:
        self.fh.close()
        return {"count": self.count, "bytes": self.nbytes, "members": self.count * len(self.stems)}


def _read_batch(fh: IO[bytes], limit: int) -> list[tuple[bytes, bytes]]:
    batch: list[tuple[bytes, bytes]] = []
    size = 0
    while size < limit:
        head = fh.read(_RECORD.size)
        if not head:
            break
        nkey, nvalue = _RECORD.unpack(head)
        key, value = fh.read(nkey), fh.read(nvalue)
        if len(head) != _RECORD.size or len(key) != nkey or len(value) != nvalue:
            raise OSError(f"{fh.name}: record {len(batch)} of this batch is truncated")
        batch.append((key, value))
        size += nkey + nvalue + 64
    return batch


class LmdbFormat(Format):
    """The LMDB format (module docstring). ``initial_map_size`` overrides the first estimate."""

    name = "lmdb"

    def __init__(self, initial_map_size: int | None = None) -> None:
        self.initial_map_size = initial_map_size
        import_lmdb()

    def part_writer(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> PartWriter:
        return LmdbPartWriter(part_dir, spec, options)

    def _map_size(self, parts: Sequence[PartResult]) -> int:
        if self.initial_map_size is not None:
            return self.initial_map_size
        count = int(sum(p.summary["members"] for p in parts))
        nbytes = int(sum(p.summary["bytes"] for p in parts))
        # values over ~2 KiB sit in overflow pages: allow a page of slack each, plus B-tree pages
        estimate = nbytes + count * 80 + min(count, nbytes // 2048 + 1) * _PAGE + (1 << 20)
        return (estimate + _PAGE - 1) // _PAGE * _PAGE

    def finalize(
        self, staging: Path, parts: Sequence[PartResult], options: WriteOptions
    ) -> dict[str, Any]:
        lmdb = import_lmdb()
        build = staging / "lmdb-building"
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir()
        stems = field_stems(options.fields)
        fields = [{"name": f, "member": s} for f, s in zip(options.fields, stems, strict=True)]
        meta = {"num_samples": options.num_samples, "fields": fields}
        try:
            env = lmdb.open(
                os.fspath(build),
                map_size=self._map_size(parts),
                subdir=True,
                lock=False,
                sync=False,
                metasync=False,
                readahead=False,
            )
            try:
                written = 0
                for part in parts:
                    with open(part.dir / "records.bin", "rb", 1 << 20) as fh:
                        while batch := _read_batch(fh, _BATCH_BYTES):
                            _put(env, lmdb, batch)
                            written += len(batch)
                _put(env, lmdb, [(META_KEY, json.dumps(meta).encode())])
                env.sync(True)
            finally:
                env.close()
        except lmdb.Error as exc:
            raise _write_error(exc, build) from None
        expected = options.num_samples * len(stems)
        if written != expected:
            raise ValueError(f"parts hold {written} field values, expected {expected}")
        os.replace(build / "data.mdb", staging / "data.mdb")
        shutil.rmtree(build)
        return {"fields": fields, "key_digits": KEY_DIGITS}

    def open(
        self, root: Path, descriptor: dict[str, Any], options: ReadOptions
    ) -> ConvertedDataset:
        return LmdbDataset(root, descriptor, options.policy)


def _write_error(exc: Exception, build: Path) -> OSError:
    """An ``lmdb.Error`` from writing as an ``OSError``: ``ENOSPC`` for a full file system.

    lmdb reports errors as text only, and a write cut short by a full disk as ``EIO``
    (``mdb_page_flush``), so a full disk is also told by the space left where it writes.
    """
    text = str(exc)
    fs = os.statvfs(build)
    free = fs.f_bavail * fs.f_frsize
    full = free < 2 * _BATCH_BYTES and os.strerror(errno.EIO) in text
    if full or any(os.strerror(code) in text for code in NO_SPACE):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(build / "data.mdb"))
    return OutputPathError(build / "data.mdb", f"LMDB could not write: {text}")


def _put(env: Any, lmdb: ModuleType, batch: list[tuple[bytes, bytes]]) -> None:
    """Write ``batch`` in one transaction, doubling the map until it fits."""
    while True:
        try:
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(batch, append=True)
            return
        except lmdb.MapFullError:
            env.set_mapsize(int(env.info()["map_size"]) * 2)


_Held = tuple[tuple[int, int], "weakref.ref[Any]"]


def _close_envs(envs: dict[str, _Held]) -> None:
    for _, ref in envs.values():
        env = ref()
        if env is not None:
            env.close()


# This process's read-only environments by folder, with the (device, inode) of the data.mdb they
# opened. lmdb opens a file once per process, and refuses to open one that an environment it
# knows of still holds: so every reader of a folder shares one environment, held by the readers'
# transactions and referenced here weakly, so that it closes when the last reader goes and a
# plain lmdb.open of the folder works again. A forked child knows its parent's: it closes them
# at the fork.
_ENVS: ProcessLocal[dict[str, _Held]] = ProcessLocal(dict, _close_envs, close_inherited=True)

# LMDB's two meta pages (pages 0 and 1): after the 16-byte page header, u32 magic and version;
# the page size in the free DB's md_pad at byte 40; the last page used at 136, the txn id at 144.
_META_MAGIC = 0xBEEFC0DE
_META_HEAD = struct.Struct("<II")
_META_PAGESIZE = struct.Struct("<I")
_META_LAST = struct.Struct("<QQ")


def _cut_short(path: str, size: int) -> str | None:
    """Why ``data.mdb`` of ``size`` bytes is shorter than its meta pages say, or None.

    lmdb maps the file and reads the pages its meta pages name: a page past the end of a
    truncated file is a ``SIGBUS`` that kills the process, not an error. (Pages are checked
    against the meta's last page by lmdb itself, so a file that long is safe to map.)
    """
    need = 0
    with open(path, "rb") as fh:
        head = os.pread(fh.fileno(), 152, 0)
        if len(head) < 152 or _META_HEAD.unpack_from(head, 16)[0] != _META_MAGIC:
            return None  # not an LMDB file: lmdb.open says so
        page = _META_PAGESIZE.unpack_from(head, 40)[0]
        if page < 512 or page > 1 << 16 or page & (page - 1):
            return f"data.mdb: meta page names an impossible page size {page}"
        for meta in (head, os.pread(fh.fileno(), 152, page)):
            if len(meta) == 152 and _META_HEAD.unpack_from(meta, 16)[0] == _META_MAGIC:
                need = max(need, (_META_LAST.unpack_from(meta, 136)[0] + 1) * page)
    if size < max(need, 2 * page):
        return (
            f"data.mdb holds {size:,} bytes, but its meta pages name {max(need, 2 * page):,} "
            "(truncated?)"
        )
    return None


def _read_env(root: Path, fail: Any) -> Any:
    """This process's read-only environment for ``root`` (lmdb opens a file once per process)."""
    key = os.path.realpath(root)
    try:
        st = os.stat(os.path.join(key, "data.mdb"))
    except OSError as exc:
        raise fail(f"cannot open data.mdb: {exc.strerror or exc}") from None
    envs = _ENVS.get()
    held = envs.pop(key, None)
    env = None if held is None else held[1]()
    if env is not None:
        if held is not None and held[0] == (st.st_dev, st.st_ino):
            envs[key] = held
            return env
        # The files were replaced: lmdb refuses to open files that an environment it knows of
        # still holds, so let that one go first.
        env.close()
    short = _cut_short(os.path.join(key, "data.mdb"), st.st_size)
    if short:
        raise fail(short)
    lmdb = import_lmdb()
    try:
        env = lmdb.open(key, subdir=True, readonly=True, lock=False, readahead=False, meminit=False)
    except lmdb.Error as exc:
        if "already open" in str(exc):
            raise fail(
                "close your own lmdb.Environment of this folder first (env.close(), or open it "
                "in a `with` block; while a dataset is open, read through its .env instead): "
                f"lmdb allows one open environment per file per process ({exc})"
            ) from None
        raise fail(f"cannot open the LMDB environment: {exc}") from None
    envs[key] = ((st.st_dev, st.st_ino), weakref.ref(env))
    return env


class LmdbDataset(ConvertedDataset):
    """Reads an LMDB conversion: each process opens one read-only environment per folder,
    shared by its readers (module docstring)."""

    def __init__(
        self, root: Path, descriptor: dict[str, Any], policy: UnpicklePolicy = DEFAULT_POLICY
    ) -> None:
        super().__init__(root, descriptor, policy)
        # per key suffix (b"x.npy"), the field's position and the member's kind
        self._suffixes: dict[bytes, tuple[int, MemberKind]] = {}
        for pos, field in enumerate(descriptor["fields"]):
            stem = field.get("member") if isinstance(field, dict) else None
            if not isinstance(stem, str):
                raise self._corrupt(f"descriptor field {pos} has no member stem")
            for kind in MemberKind:
                self._suffixes[f"{stem}.{kind.ext}".encode()] = (pos, kind)
        # per field, the key suffix its last value had: tried first with one get per field
        self._guess: list[tuple[bytes, MemberKind] | None] = [None] * len(self.fields)
        # this process's read transaction (it holds the environment open: see _ENVS)
        self._txn: ProcessLocal[Any] = ProcessLocal(self._begin)
        self._txn.get()

    def _begin(self) -> Any:
        return _read_env(self.root, self._corrupt).begin(buffers=True)

    @property
    def env(self) -> Any:
        """This process's ``lmdb.Environment`` of the folder: read through it while this
        dataset is open (lmdb refuses a second ``lmdb.open`` of the same file meanwhile)."""
        self._txn.get()  # the environment stays open while this process's transaction holds it
        return _read_env(self.root, self._corrupt)

    def _get(self, i: int) -> Sample:
        prefix = sample_prefix(i)
        try:
            txn = self._txn.get()
            values = [None if g is None else txn.get(prefix + g[0]) for g in self._guess]
        except import_lmdb().Error as exc:
            raise self._corrupt(f"cannot read from the LMDB environment: {exc}", i) from None
        if any(v is None for v in values):  # a field stored as another kind: find its key
            return self._scan(i, prefix)
        return tuple(
            self._decode_value(g[1], v, i)  # type: ignore[index,arg-type]  # checked above
            for g, v in zip(self._guess, values, strict=True)
        )

    def _scan(self, i: int, prefix: bytes) -> Sample:
        """Sample ``i`` from a cursor over its keys; remembers each field's key suffix."""
        lmdb = import_lmdb()
        nf = len(self.fields)
        out: list[Any] = [None] * nf
        seen: set[int] = set()
        try:
            cursor = self._txn.get().cursor()
            found = cursor.set_range(prefix)
            while found and len(seen) < nf:
                key = bytes(cursor.key())
                if not key.startswith(prefix):
                    break
                where = self._suffixes.get(key[len(prefix) :])
                if where is None or where[0] in seen:
                    raise self._corrupt(f"unexpected key {key[:80]!r}", i)
                out[where[0]] = self._decode_value(where[1], cursor.value(), i)
                self._guess[where[0]] = (key[len(prefix) :], where[1])
                seen.add(where[0])
                found = cursor.next()
        except lmdb.Error as exc:  # e.g. the files were replaced and reopened elsewhere
            raise self._corrupt(f"cannot read from the LMDB environment: {exc}", i) from None
        if len(seen) != nf:
            raise self._corrupt(
                f"found {len(seen)} of the sample's {nf} keys {prefix.decode()}<field>.<ext>", i
            )
        return tuple(out)

    def __reduce__(self) -> tuple[Any, ...]:
        return (LmdbDataset, (self.root, self.descriptor, self.policy))


register_format(LmdbFormat)
