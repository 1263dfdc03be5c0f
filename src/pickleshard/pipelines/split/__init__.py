"""Split one pickle file into chunk pickles (:mod:`.run`, :mod:`.source`, :mod:`.chunkwriter`)."""

from .run import SplitReport, split

__all__ = ["SplitReport", "split"]
