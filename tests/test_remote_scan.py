"""The scan of a source that cannot be mapped (``memory://`` through fsspec, as a remote object):
the same result and the same errors as the scan of the local file, fetching only what it examines."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

fsspec = pytest.importorskip("fsspec")

from pickleshard.io.remote.source import FsspecSource  # noqa: E402
from pickleshard.pipelines.synth import write_synthetic  # noqa: E402
from pickleshard.scan import scan_file  # noqa: E402


def _remote(path: Path, data: bytes) -> FsspecSource:
    fsspec.filesystem("memory").pipe(f"/scan/{path.name}", data)
    return FsspecSource(f"memory://scan/{path.name}")


def _outcome(where: object) -> tuple[str, object]:
    try:
        r = scan_file(where)  # type: ignore[arg-type]
    except Exception as exc:
        return type(exc).__name__, str(exc).split(": ", 1)[-1]
    return r.layout, (
        r.fields,
        np.asarray(r.starts).tolist(),
        np.asarray(r.ends).tolist(),
        np.asarray(r.records).tolist(),
        r.meta(),
    )


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
    assert _outcome(source) == _outcome(path)
    if kind == "arrays" and shape == (3, 112, 112) and protocol >= 4:
        assert source.counters.bytes < 0.05 * len(data)  # opcodes fetched, payloads skipped
        xs, _ = pickle.loads(data)
        assert len(xs) == per_file


@pytest.mark.parametrize("damage", ["half", "flip", "tail", "empty", "text", "huge length"])
def test_bad_bytes_give_the_same_error_remotely(tmp_path: Path, damage: str) -> None:
    path = write_synthetic(tmp_path, files=1, per_file=20, shape=(3, 112, 112))[0]
    data = path.read_bytes()
    bad = {
        "half": data[: len(data) // 2],
        "flip": data[:300] + b"\xfe" + data[301:],
        "tail": data[:-3],
        "empty": b"",
        "text": b"hello world\n" * 1000,
        "huge length": data[:200] + b"\x96" + (1 << 62).to_bytes(8, "little") + data[209:],
    }[damage]
    path.write_bytes(bad)
    assert _outcome(_remote(path, bad)) == _outcome(path)
