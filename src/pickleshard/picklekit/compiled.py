"""The compiled core, ``pickleshard._cscan`` (Cython, built by ``pip install``), imported here
and nowhere else.

:data:`CORE` is the extension module, or None where it is not built: every user has a pure-Python
path (the reference its compiled twin is tested against), so a missing extension is slower, never
wrong. :func:`require` is for the places that were told to use it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["CORE", "require"]

# By its full name: an extension is no Python source for the import contract to read (its own
# imports are picklekit's modules and errors, below this one), and `from .. import` would read
# as an import of the whole package.
CORE: ModuleType | None
try:
    CORE = importlib.import_module("pickleshard._cscan")
except ImportError:  # not built (a source tree without the build step)
    CORE = None


def require() -> ModuleType:
    """The compiled core; ``ImportError`` saying how to build it when it is absent."""
    if CORE is None:
        raise ImportError(
            "the compiled scanner pickleshard._cscan is not built (pip install -e . builds it)"
        )
    return CORE
