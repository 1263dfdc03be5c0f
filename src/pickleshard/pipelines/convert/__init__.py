"""Convert a pickle dataset to an output format (:mod:`.run`; writing its parts, :mod:`.parts`)."""

from .run import ConvertReport, convert

__all__ = ["ConvertReport", "convert"]
