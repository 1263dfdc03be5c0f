"""The shared format tests (pickleshard.testing.FormatTests) for the memmap format."""

from __future__ import annotations

from pickleshard.testing import FormatTests


class TestMemmapFormat(FormatTests):
    format = "memmap"
