"""What is in a pickle file, and is it safe to load? (:mod:`.file`; its report, :mod:`.report`)"""

from .file import inspect_file
from .report import FileReport

__all__ = ["FileReport", "inspect_file"]
