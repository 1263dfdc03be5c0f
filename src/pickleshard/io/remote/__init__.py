"""Remote objects through fsspec: :mod:`.source` (ranged reads, :class:`.source.FsspecSource`),
:mod:`.blocks` (the block cache), :mod:`.listing` (objects under a prefix).

The package imports none of them itself: :mod:`pickleshard.io.options` needs the block cache
below :mod:`pickleshard.io.base`, which the sources build on.
"""
