"""Remote objects through fsspec: :mod:`.source` (ranged reads), :mod:`.blocks` (the block
cache), :mod:`.listing` (objects under a prefix).
"""

from .source import FsspecSource

__all__ = ["FsspecSource"]
