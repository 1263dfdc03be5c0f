"""``ByteSourceTests``: the contract of :class:`pickleshard.io.ByteSource`, as tests every source
passes; a source's test file subclasses it and implements :meth:`ByteSourceTests.make_source`.

Every test writes random bytes to a file under ``tmp_path`` and asks the subclass for a source
over them, then compares what the source returns with those bytes (the oracle). A remote or
in-memory source may ignore the file and hold the bytes itself; it then overrides
:meth:`ByteSourceTests.rewrite` so the identity test can change its content.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ..io import ByteSource

__all__ = ["ByteSourceTests"]

SIZE = 100_003  # not a multiple of a page: the last read is short

_CHILD = """
import hashlib, pickle, sys
source = pickle.loads(bytes.fromhex(sys.stdin.read()))
print(source.size, hashlib.sha256(source.read_at(0, source.size)).hexdigest())
"""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_in_child(source: ByteSource, conn: Any) -> None:
    """A forked child's read of the source it inherited (not unpickled: the same object)."""
    conn.send((source.size, _digest(source.read_at(0, source.size))))
    conn.close()


class ByteSourceTests:
    """The tests; subclass and implement :meth:`make_source` (and :meth:`rewrite` for a source
    that does not read ``path``)."""

    def make_source(self, path: Path, data: bytes) -> ByteSource:
        """A new source over ``data``, which the kit has just written to ``path``."""
        raise NotImplementedError

    def rewrite(self, path: Path, source: ByteSource, data: bytes) -> None:
        """Replace the content ``source`` stands for with ``data`` (default: rewrite ``path``
        in place, same inode)."""
        with open(path, "r+b") as fh:
            fh.truncate(0)
            fh.write(data)

    def count_reads(self, source: ByteSource) -> Callable[[], int]:
        """Count the storage reads ``source`` makes from now on; return the counter. Default:
        outermost calls of its ``read_at`` and ``readinto_at`` (a source whose ``read_ranges``
        reads otherwise overrides this)."""
        calls, depth = [0], [0]
        for name in ("read_at", "readinto_at"):
            real = getattr(source, name)

            def counted(*args: Any, _real: Any = real) -> Any:
                calls[0] += depth[0] == 0  # a read_at made of readinto_at calls is one read
                depth[0] += 1
                try:
                    return _real(*args)
                finally:
                    depth[0] -= 1

            setattr(source, name, counted)
        return lambda: calls[0]

    # -- fixtures ------------------------------------------------------------------------------
    @pytest.fixture
    def data(self) -> bytes:
        return np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8).tobytes()

    @pytest.fixture
    def path(self, tmp_path: Path, data: bytes) -> Path:
        p = tmp_path / "data.bin"
        p.write_bytes(data)
        return p

    @pytest.fixture
    def source(self, path: Path, data: bytes) -> Any:
        src = self.make_source(path, data)
        yield src
        src.close()

    # -- reads -----------------------------------------------------------------------------------
    def test_name_and_size(self, source: ByteSource, data: bytes) -> None:
        assert isinstance(source.name, str)
        assert source.name
        assert source.size == len(data)

    @pytest.mark.parametrize(("offset", "n"), [(0, 1), (0, 4096), (12_345, 6_789), (SIZE - 7, 7)])
    def test_read_at_is_exact(self, source: ByteSource, data: bytes, offset: int, n: int) -> None:
        assert source.read_at(offset, n) == data[offset : offset + n]

    def test_read_at_is_short_at_the_end_and_empty_past_it(
        self, source: ByteSource, data: bytes
    ) -> None:
        assert source.read_at(SIZE - 5, 100) == data[-5:]
        assert source.read_at(SIZE, 10) == b""
        assert source.read_at(SIZE + 1000, 10) == b""
        assert source.read_at(10, 0) == b""

    @pytest.mark.parametrize(("offset", "n"), [(-1, 5), (0, -1)])
    def test_a_negative_range_is_a_value_error(
        self, source: ByteSource, offset: int, n: int
    ) -> None:
        with pytest.raises(ValueError, match="-1"):  # it names the bad value
            source.read_at(offset, n)
        with pytest.raises(ValueError, match="-1"):  # it names the bad value
            source.read_ranges([(0, 1), (offset, n)])

    def test_readinto_at(self, source: ByteSource, data: bytes) -> None:
        out = bytearray(1000)
        assert source.readinto_at(500, memoryview(out)) == 1000
        assert bytes(out) == data[500:1500]
        out = bytearray(1000)
        assert source.readinto_at(SIZE - 10, memoryview(out)) == 10
        assert bytes(out[:10]) == data[-10:]

    def test_read_ranges_keep_the_order_asked(self, source: ByteSource, data: bytes) -> None:
        ranges = [(50_000, 10), (0, 10), (50_010, 20), (90_000, 100), (SIZE - 3, 10), (7, 0)]
        got = source.read_ranges(ranges)
        assert got == [data[o : o + n] for o, n in ranges]

    def test_read_ranges_coalesce_neighbours(
        self, path: Path, data: bytes, source: ByteSource
    ) -> None:
        # past an object's first 16 KiB, which a remote source fetches whole on its first read
        ranges = [(20_200, 10), (20_000, 10), (21_000, 50), (90_000, 100)]
        reads = self.count_reads(source)
        assert source.read_ranges(ranges) == [data[o : o + n] for o, n in ranges]
        assert reads() == 2  # 20_000..21_050 in one read (gaps under a page), 90_000 in another
        assert source.read_ranges(ranges, gap=0) == [data[o : o + n] for o, n in ranges]
        assert reads() == 2 + 4

    # -- identity --------------------------------------------------------------------------------
    def test_identity_and_changed_since_a_rewrite(
        self, path: Path, source: ByteSource, data: bytes
    ) -> None:
        recorded = source.identity()
        assert recorded.size == len(data)
        assert source.changed_since(recorded) is None
        self.rewrite(path, source, data[: SIZE // 2])
        now = source.identity()
        assert now.size == SIZE // 2
        what = source.changed_since(recorded)
        assert what is not None
        assert str(SIZE // 2) in what

    # -- processes -------------------------------------------------------------------------------
    def test_pickles_into_a_fresh_process(self, source: ByteSource, data: bytes) -> None:
        source.read_at(0, 10)  # opened here first: nothing of that may travel
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        out = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=pickle.dumps(source).hex(),
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [str(len(data)), _digest(data)]
        again = pickle.loads(pickle.dumps(source))
        assert again.read_at(0, SIZE) == data

    @pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
    def test_a_forked_child_reads_through_its_own_handle(
        self, source: ByteSource, data: bytes
    ) -> None:
        source.read_at(0, 10)
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_read_in_child, args=(source, child))
        proc.start()
        got = parent.recv() if parent.poll(120) else None
        proc.join(120)
        assert got == (len(data), _digest(data))
        assert source.read_at(0, SIZE) == data  # the parent's handle still works

    # -- hints, maps, lifetime -------------------------------------------------------------------
    @pytest.mark.parametrize("pattern", ["sequential", "random", "normal"])
    def test_advise_is_accepted(self, source: ByteSource, data: bytes, pattern: Any) -> None:
        source.read_at(0, 1)
        source.advise(pattern)
        assert source.read_at(4096, 9000) == data[4096:13096]
        assert source.read_ranges([(SIZE - 100, 100)]) == [data[-100:]]

    def test_map_is_none_or_the_bytes(self, source: ByteSource, data: bytes) -> None:
        mapped = source.map()
        if mapped is not None:
            assert len(mapped) == len(data)
            assert bytes(mapped[:]) == data

    def test_fileno_is_none_or_a_descriptor_of_the_bytes(
        self, source: ByteSource, data: bytes
    ) -> None:
        fd = source.fileno()
        if fd is not None:
            assert os.pread(fd, 100, 1000) == data[1000:1100]

    def test_close_then_reuse(self, source: ByteSource, data: bytes) -> None:
        assert source.read_at(0, 100) == data[:100]
        source.close()
        source.close()  # twice: no error
        assert source.read_at(100, 100) == data[100:200]
        with source as same:
            assert same.read_ranges([(0, 3)]) == [data[:3]]
        assert source.read_at(SIZE - 1, 1) == data[-1:]

    def test_an_empty_source(self, tmp_path: Path) -> None:
        path = tmp_path / "empty.bin"
        path.write_bytes(b"")
        with self.make_source(path, b"") as empty:
            assert empty.size == 0
            assert empty.read_at(0, 10) == b""
            assert empty.read_ranges([(0, 0), (0, 5)]) == [b"", b""]
            assert empty.identity().size == 0
