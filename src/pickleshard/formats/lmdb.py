"""LMDB: one key per sample, values decodable by plain code without pickle.

On disk::

    OUT/data.mdb          the LMDB environment (``lmdb.open("OUT", readonly=True, lock=False)``)
    OUT/pickleshard.json  descriptor
    OUT/hashes.npy        uint8 (N, 16) content digests (see pickleshard.formats.base)

Keys: sample ``i`` is ``i.to_bytes(8, "big")`` (fixed width, so byte order is index order);
one more key, ``b"__pickleshard__"``, holds the descriptor's JSON (num_samples, fields).

Values (little-endian)::

    b"PSL1"                 magic, 4 bytes
    u16 F                   number of fields
    F x (u8 kind, u64 n)    per field: member kind and payload length (9 bytes each)
    payloads                back to back, in field order

Kinds are those of :class:`pickleshard.formats.encoding.MemberKind`: 0 ``npy`` (``np.save``
bytes: ``np.load(io.BytesIO(p))``), 1 ``scalar.npy`` (0-d ``.npy``; the value is ``arr[()]``),
2 ``cls`` (ASCII int), 3 ``json``, 4 ``pss`` (the safe codec). Plain decoding::

    nf = struct.unpack_from("<H", v, 4)[0]
    heads = [struct.unpack_from("<BQ", v, 6 + 9 * k) for k in range(nf)]

The map grows as needed while writing (``MapFullError`` -> double and retry the batch).
Needs ``pip install 'pickleshard[lmdb]'``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from ..errors import MissingDependencyError, OutputPathError
from ..io.handles import ProcessLocal
from .base import (
    ConvertedDataset,
    Format,
    IterableOptions,
    PartResult,
    PartSpec,
    PartWriter,
    Sample,
    WriteOptions,
)
from .encoding import decode_member, encode_member
from .files import NO_SPACE
from .registry import register_format

__all__ = ["LmdbDataset", "LmdbFormat", "pack_sample", "unpack_sample"]

MAGIC = b"PSL1"
META_KEY = b"__pickleshard__"
KEY_BYTES = 8
_HEAD = struct.Struct("<BQ")
_HEADS: dict[int, struct.Struct] = {}
_LEN = struct.Struct("<Q")
_BATCH_BYTES = 32 << 20
_PAGE = 4096


def import_lmdb() -> ModuleType:
    """The ``lmdb`` module, or :class:`MissingDependencyError` with the install hint."""
    try:
        import lmdb
    except ImportError:
        raise MissingDependencyError("lmdb", "lmdb", "the LMDB format") from None
    return lmdb


def sample_key(i: int) -> bytes:
    return i.to_bytes(KEY_BYTES, "big")


def pack_sample(sample: Sample) -> bytes:
    """The LMDB value of one sample (module docstring). Raises ``TypeError`` if unencodable."""
    members = [encode_member(v) for v in sample]
    heads = b"".join(_HEAD.pack(int(kind), len(data)) for kind, data in members)
    return b"".join([MAGIC, struct.pack("<H", len(members)), heads, *(d for _, d in members)])


def _heads(nf: int) -> struct.Struct:
    """The struct of ``nf`` field headers, made once per field count."""
    heads = _HEADS.get(nf)
    if heads is None:
        heads = _HEADS[nf] = struct.Struct("<" + "BQ" * nf)
    return heads


def unpack_sample(value: bytes | memoryview) -> Sample:
    """Inverse of :func:`pack_sample`; raises ``ValueError`` on malformed bytes."""
    view = memoryview(value).cast("B")
    if len(view) < 6 or view[:4].tobytes() != MAGIC:
        raise ValueError("value does not start with the PSL1 magic")
    nf = view[4] | view[5] << 8
    pos = 6 + 9 * nf
    if pos > len(view):
        raise ValueError("value ends inside its field headers")
    heads = _heads(nf).unpack_from(view, 6)
    out = []
    for k in range(nf):
        kind, n = heads[2 * k], heads[2 * k + 1]
        if pos + n > len(view):
            raise ValueError(f"field {k} runs past the end of the value")
        out.append(decode_member(kind, view[pos : pos + n]))
        pos += n
    if pos != len(view):
        raise ValueError(f"{len(view) - pos} trailing bytes after the last field")
    return tuple(out)


class LmdbPartWriter(PartWriter):
    """Writes ``records.bin``: per sample, a u64 length and its packed value."""

    def __init__(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> None:
        super().__init__(part_dir, spec, options)
        self.fh: IO[bytes] = open(part_dir / "records.bin", "wb", 1 << 20)  # noqa: SIM115
        self.count = 0
        self.nbytes = 0

    def write(self, index: int, sample: Sample) -> None:
        value = pack_sample(sample)
        self.fh.write(_LEN.pack(len(value)))
        self.fh.write(value)
        self.count += 1
        self.nbytes += len(value)

    def close(self) -> dict[str, Any]:
        self.fh.close()
        return {"count": self.count, "bytes": self.nbytes}


def _read_batch(fh: IO[bytes], first: int, limit: int) -> list[tuple[bytes, bytes]]:
    batch: list[tuple[bytes, bytes]] = []
    size = 0
    while size < limit:
        head = fh.read(8)
        if not head:
            break
        (n,) = _LEN.unpack(head)
        value = fh.read(n)
        if len(value) != n:
            raise OSError(f"{fh.name}: record {first + len(batch)} is truncated")
        batch.append((sample_key(first + len(batch)), value))
        size += n + 64
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
        count = int(sum(p.summary["count"] for p in parts))
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
        fields = [{"name": f} for f in options.fields]
        meta = {"num_samples": options.num_samples, "fields": list(options.fields)}
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
                first = 0
                for part in parts:
                    with open(part.dir / "records.bin", "rb", 1 << 20) as fh:
                        while batch := _read_batch(fh, first, _BATCH_BYTES):
                            _put(env, lmdb, batch)
                            first += len(batch)
                _put(env, lmdb, [(META_KEY, json.dumps(meta).encode())])
                env.sync(True)
            finally:
                env.close()
        except lmdb.Error as exc:
            raise _write_error(exc, build) from None
        if first != options.num_samples:
            raise ValueError(f"parts hold {first} samples, expected {options.num_samples}")
        os.replace(build / "data.mdb", staging / "data.mdb")
        shutil.rmtree(build)
        return {"fields": fields, "key_bytes": KEY_BYTES, "value_magic": MAGIC.decode()}

    def open(
        self, root: Path, descriptor: dict[str, Any], iterable: IterableOptions
    ) -> ConvertedDataset:
        return LmdbDataset(root, descriptor)


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


def _close_envs(envs: dict[str, tuple[tuple[int, int], Any]]) -> None:
    for _, env in envs.values():
        env.close()


# This process's read-only environments by folder, with the (device, inode) of the data.mdb they
# opened: lmdb opens a file once per process, and refuses to open one that an environment it
# knows of still holds; a forked child knows its parent's, so it closes them at the fork.
_ENVS: ProcessLocal[dict[str, tuple[tuple[int, int], Any]]] = ProcessLocal(
    dict, _close_envs, close_inherited=True
)

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
    held = envs.get(key)
    if held is not None:
        if held[0] == (st.st_dev, st.st_ino):
            return held[1]
        # The files were replaced: lmdb refuses to open files that an environment it knows of
        # still holds, so let that one go first.
        del envs[key]
        held[1].close()
    short = _cut_short(os.path.join(key, "data.mdb"), st.st_size)
    if short:
        raise fail(short)
    lmdb = import_lmdb()
    try:
        env = lmdb.open(key, subdir=True, readonly=True, lock=False, readahead=False, meminit=False)
    except lmdb.Error as exc:
        raise fail(f"cannot open the LMDB environment: {exc}") from None
    envs[key] = ((st.st_dev, st.st_ino), env)
    return env


class LmdbDataset(ConvertedDataset):
    """Reads an LMDB conversion; each process opens its own read-only environment."""

    def __init__(self, root: Path, descriptor: dict[str, Any]) -> None:
        super().__init__(root, descriptor)
        # this process's read transaction (its environment is _ENVS', shared by every reader)
        self._txn: ProcessLocal[Any] = ProcessLocal(self._begin)
        self._txn.get()

    def _begin(self) -> Any:
        return _read_env(self.root, self._corrupt).begin(buffers=True)

    def _get(self, i: int) -> Sample:
        try:
            value = self._txn.get().get(sample_key(i))
        except import_lmdb().Error as exc:  # e.g. the files were replaced and reopened elsewhere
            raise self._corrupt(f"cannot read from the LMDB environment: {exc}", i) from None
        if value is None:
            raise self._corrupt("no value under this sample's key", i)
        try:
            return unpack_sample(value)
        except ValueError as exc:
            raise self._corrupt(f"cannot decode value: {exc}", i) from None

    def __reduce__(self) -> tuple[Any, ...]:
        return (LmdbDataset, (self.root, self.descriptor))


register_format(LmdbFormat)
