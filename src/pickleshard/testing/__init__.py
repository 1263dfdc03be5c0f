"""Test kits shipped with pickleshard, as ``zarr.testing`` is with zarr: the contracts a
third-party format, byte source or sampler passes, each a base class or checker its tests reuse.

- formats (:mod:`~pickleshard.testing.formats`): :class:`FormatTests`, whose oracle
  (:mod:`~pickleshard.testing.oracle`) is ``pickle.load`` of the source files and exact equality;
- sources (:mod:`~pickleshard.testing.sources`): :class:`ByteSourceTests`, with loopback servers
  for remote sources in :mod:`~pickleshard.testing.servers` (needs ``moto[server]``);
- resume (:mod:`~pickleshard.testing.resume`): :func:`check_resume` and its rescaled and
  ``StatefulDataLoader`` variants, for samplers that save and load their state.

A format's whole test file is one subclass::

    from pickleshard.testing import FormatTests

    class TestMemmap(FormatTests):
        format = "memmap"

The kits need ``pytest`` (imported only by this package). The bad-input and fault corpus harness
is the project's own test code, under ``tests/corpus/``.
"""

from .formats import FormatTests
from .oracle import SLOW_GLOBAL, SlowInt, assert_same, oracle_samples, same, write_files
from .resume import (
    check_loader_resume,
    check_rescaled_resume,
    check_resume,
    loader_ids,
    write_id_files,
)
from .sources import ByteSourceTests

__all__ = [
    "SLOW_GLOBAL",
    "ByteSourceTests",
    "FormatTests",
    "SlowInt",
    "assert_same",
    "check_loader_resume",
    "check_rescaled_resume",
    "check_resume",
    "loader_ids",
    "oracle_samples",
    "same",
    "write_files",
    "write_id_files",
]
