"""Test kit shipped with pickleshard, as ``zarr.testing`` is with zarr.

A format's whole test file is one subclass::

    from pickleshard.testing import FormatTests

    class TestMemmap(FormatTests):
        format = "memmap"

:class:`FormatTests` needs ``pytest`` (imported only by this package).
"""

from .formats import FormatTests
from .oracle import SLOW_GLOBAL, SlowInt, assert_same, oracle_samples, write_files

__all__ = ["SLOW_GLOBAL", "FormatTests", "SlowInt", "assert_same", "oracle_samples", "write_files"]
