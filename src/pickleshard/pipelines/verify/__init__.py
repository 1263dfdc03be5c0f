"""Check a conversion against its source (:mod:`.run`; per-task work, :mod:`.parts`)."""

from .run import VerifyReport, verify

__all__ = ["VerifyReport", "verify"]
