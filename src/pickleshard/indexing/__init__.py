"""Building an index: each file described (scanned, sized, audited) wherever an executor runs
it, the results written, and an index opened with its rebuild policy. This layer reads files
(:mod:`pickleshard.read`) to size decoded samples; :mod:`pickleshard.index` is the data it writes.
"""

from .build import build_index
from .opening import Rebuild, open_index

__all__ = ["Rebuild", "build_index", "open_index"]
