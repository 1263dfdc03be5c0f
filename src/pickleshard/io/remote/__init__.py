"""Remote objects through fsspec: :mod:`.source` (ranged reads, :class:`.source.FsspecSource`),
:mod:`.blocks` (the block cache), :mod:`.listing` (objects under a prefix), :mod:`.filesystems`
(one filesystem per protocol and options), :mod:`.known` (identities just looked up, for the
opens), :mod:`.inflight` (the budget of bytes in flight), :mod:`.link` (latency and bandwidth),
:mod:`.staging` (ranges fetched ahead), :mod:`.counting` (requests and bytes).

The package imports none of them itself: :mod:`pickleshard.io.options` needs the block cache
below :mod:`pickleshard.io.base`, which the sources build on.
"""
