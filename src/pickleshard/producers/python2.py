"""Python 2 pickles: a ``str`` that does not decode becomes an error that says what to pass.

Python 2's ``str`` is bytes; its pickles store it as ``BINSTRING`` / ``SHORT_BINSTRING``, which
Python 3 decodes with the ``encoding`` given to the unpickler (``"ASCII"`` by default). Any byte
above 127 then raises ``UnicodeDecodeError`` from deep inside the load. Numpy arrays pickled
by Python 2 keep their raw data in such a ``str``, so ``encoding="latin1"`` (which maps every
byte to one code point and back) is what loads them; ``"bytes"`` keeps every such ``str`` as
``bytes``.
"""

from __future__ import annotations

from ..errors import TextEncodingError

__all__ = ["PYTHON2_HINT", "is_python2_str", "python2_error"]

PYTHON2_HINT = "written by Python 2? pass encoding='latin1' (numpy arrays) or 'bytes'"


def is_python2_str(exc: BaseException) -> bool:
    """Whether ``exc`` is a Python 2 ``str`` failing to decode with the encoding given: a
    ``UnicodeDecodeError`` in any codec but UTF-8 (a ``BINUNICODE`` string, always UTF-8,
    that does not decode is damage, not Python 2)."""
    return isinstance(exc, UnicodeDecodeError) and exc.encoding.lower().replace("-", "") not in (
        "utf8",
        "utf8surrogatepass",
    )


def python2_error(
    path: str,
    exc: UnicodeDecodeError,
    encoding: str,
    *,
    offset: int | None = None,
    sample: int | None = None,
) -> TextEncodingError:
    """The error for ``exc``, a ``str`` of the pickle at ``path`` (from ``offset``, for
    ``sample`` where known) that ``encoding`` cannot decode."""
    bad = exc.object[exc.start : exc.start + 1] if isinstance(exc.object, bytes) else b""
    return TextEncodingError(
        path,
        f"UnicodeDecodeError: a str in the pickle does not decode as {encoding} "
        f"({exc.reason}, byte {bad!r}): "
        f"{PYTHON2_HINT} (CLI: --encoding latin1)",
        offset=offset,
        sample=sample,
    )
