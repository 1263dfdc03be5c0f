"""The shared format tests (pickleshard.testing.FormatTests) for the webdataset format."""

from __future__ import annotations

from pickleshard.testing import FormatTests


class TestWebDatasetFormat(FormatTests):
    format = "webdataset"
