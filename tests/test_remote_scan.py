"""The scan of a source that cannot be mapped (``memory://`` through fsspec, as a remote object):
the same result and the same errors as the scan of the local file, fetching only what it examines."""

from __future__ import annotations

import pickle
import pickletools
from pathlib import Path

import numpy as np
import pytest

fsspec = pytest.importorskip("fsspec")

from pickleshard.errors import PickleshardError  # noqa: E402
from pickleshard.io.remote.source import FsspecSource  # noqa: E402
from pickleshard.pipelines.synth import write_synthetic  # noqa: E402
from pickleshard.scan import scan_file  # noqa: E402


def _remote(path: Path, data: bytes) -> FsspecSource:
    fsspec.filesystem("memory").pipe(f"/scan/{path.name}", data)
    return FsspecSource(f"memory://scan/{path.name}")


def _scanned(where: Path | FsspecSource) -> tuple[object, ...]:
    """What a scan found; it must succeed (an exception fails the test)."""
    r = scan_file(where)
    return (
        r.layout,
        r.fields,
        np.asarray(r.starts).tolist(),
        np.asarray(r.ends).tolist(),
        np.asarray(r.records).tolist(),
        r.meta(),
    )


def _refused(where: Path | FsspecSource) -> tuple[type[PickleshardError], str]:
    """The package error a scan raises, its class and its message without the location."""
    with pytest.raises(PickleshardError) as info:
        scan_file(where)
    return type(info.value), str(info.value).split(": ", 1)[-1]


@pytest.mark.parametrize(
    ("kind", "shape", "per_file", "protocol"),
    [
        ("arrays", (3, 112, 112), 12, 5),
        ("arrays", (3, 112, 112), 12, 4),
        ("arrays", (3, 32, 32), 40, 5),
        ("arrays", (16,), 300, 5),
        ("objects", (1,), 200, 5),
        ("arrays", (3, 64, 64), 10, 2),
    ],
)
def test_a_remote_scan_equals_the_local_one(
    tmp_path: Path, kind: str, shape: tuple[int, ...], per_file: int, protocol: int
) -> None:
    path = write_synthetic(
        tmp_path,
        files=1,
        per_file=per_file,
        shape=shape,
        kind=kind,
        protocol=protocol,  # type: ignore[arg-type]
    )[0]
    data = path.read_bytes()
    source = _remote(path, data)
    local = _scanned(path)
    assert _scanned(source) == local
    xs, ys = pickle.loads(data)
    assert len(local[2]) == len(xs) == len(ys) == per_file  # a span per sample of pickle.load
    if kind == "arrays" and shape == (3, 112, 112) and protocol >= 4:
        assert source.counters.bytes < 0.05 * len(data)  # opcodes fetched, payloads skipped


@pytest.mark.parametrize("damage", ["half", "payload flip", "tail", "empty", "text", "huge length"])
def test_bad_bytes_give_the_same_error_remotely(tmp_path: Path, damage: str) -> None:
    """Each damage is refused with the same package error both ways; a flipped payload byte,
    which a scan does not read, scans the same both ways."""
    path = write_synthetic(tmp_path, files=1, per_file=20, shape=(3, 112, 112))[0]
    data = path.read_bytes()
    # the first array's BYTEARRAY8: its 8-byte length, then its payload
    at = next(pos for op, _, pos in pickletools.genops(data) if op.name == "BYTEARRAY8")
    payload = at + 9
    bad = {
        "half": data[: len(data) // 2],
        "payload flip": data[: payload + 100]
        + bytes([data[payload + 100] ^ 0xFF])
        + data[payload + 101 :],
        "tail": data[:-3],
        "empty": b"",
        "text": b"hello world\n" * 1000,
        "huge length": data[: at + 1] + (1 << 62).to_bytes(8, "little") + data[payload:],
    }[damage]
    path.write_bytes(bad)
    if damage == "payload flip":
        assert _scanned(_remote(path, bad)) == _scanned(path)
    else:
        assert _refused(_remote(path, bad)) == _refused(path)
