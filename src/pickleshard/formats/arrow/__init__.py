"""Parquet and Arrow IPC (:mod:`.format`), their column types, values, writer and reader."""

from .format import ArrowFormat, ParquetFormat

__all__ = ["ArrowFormat", "ParquetFormat"]
