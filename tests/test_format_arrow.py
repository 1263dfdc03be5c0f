"""The Parquet and Arrow formats: the shared kit, column types, and the reader's checks."""

from __future__ import annotations

import pytest

from pickleshard.testing import FormatTests

pytest.importorskip("pyarrow")


class TestParquetFormat(FormatTests):
    format = "parquet"


class TestArrowFormat(FormatTests):
    format = "arrow"
