"""The shared format tests (pickleshard.testing.FormatTests) for the lmdb format."""

from __future__ import annotations

from pickleshard.testing import FormatTests


class TestLmdbFormat(FormatTests):
    format = "lmdb"
