"""Every compressed source passes the byte-source kit: the decompressed bytes are the oracle."""

from __future__ import annotations

from pathlib import Path

import pytest

from compressors import KIND, SUFFIX, compress_to
from pickleshard.io import ByteSource, open_source
from pickleshard.io.compressed.source import CompressedSource
from pickleshard.testing.sources import ByteSourceTests


class _Compressed(ByteSourceTests):
    how = ""

    def _target(self, path: Path) -> Path:
        return path.with_name(path.name + SUFFIX[self.how])

    def make_source(self, path: Path, data: bytes) -> ByteSource:
        source = open_source(compress_to(self._target(path), data, self.how))
        assert isinstance(source, CompressedSource)
        assert source.kind == KIND[self.how]
        return source

    def rewrite(self, path: Path, source: ByteSource, data: bytes) -> None:
        compress_to(self._target(path), data, self.how)


class TestGzip(_Compressed):
    how = "gzip"


class TestBz2(_Compressed):
    how = "bz2"


class TestXzBlocks(_Compressed):
    how = "xz-blocks"


class TestXzSingle(_Compressed):
    how = "xz-single"


class TestZstdSeekable(_Compressed):
    how = "zstd-seekable"


class TestZstdPlain(_Compressed):
    how = "zstd-plain"


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("gzip", "seek points built"),
        ("bz2", "seek points built"),
        ("xz-blocks", "blocks"),
        ("xz-single", "cache built"),
        ("zstd-seekable", "frames"),
        ("zstd-plain", "cache built"),
    ],
)
def test_each_form_is_read_the_way_it_allows(tmp_path: Path, how: str, expected: str) -> None:
    data = bytes(range(256)) * 400
    path = compress_to(tmp_path / f"f{SUFFIX[how]}", data, how)
    with open_source(path) as source:
        assert isinstance(source, CompressedSource)
        assert source.read_at(70_000, 100) == data[70_000:70_100]
        assert source.how == expected
