"""This process's fsspec filesystems, one per protocol and set of storage options.

:func:`filesystem` opens (once per process: nothing holding a socket crosses a fork) the
filesystem a URL and its storage options name; :func:`filesystem_key` is that name, by which
what one filesystem answered is kept (:mod:`~pickleshard.io.remote.known`). fsspec and its
backends are optional: a missing one raises :class:`~pickleshard.errors.MissingDependencyError`
with the extra that installs it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from ...errors import MissingDependencyError
from ..handles import ProcessLocal

__all__ = ["filesystem", "filesystem_key", "is_url"]

# this process's filesystems: (protocol, token of options) -> fs; a forked child makes its own
_FILESYSTEMS: ProcessLocal[dict[tuple[str, str], Any]] = ProcessLocal(dict)
_FS_LOCK = threading.Lock()


def is_url(where: str | os.PathLike[str]) -> bool:
    """Whether ``where`` is a URL (``scheme://...``) rather than a local path."""
    text = os.fspath(where)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme != "file"


# the extra of pyproject.toml that installs a protocol's fsspec backend
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}


def _fsspec(url: str) -> Any:
    try:
        import fsspec
    except ImportError:
        protocol = url.partition("://")[0]
        extra = _EXTRAS.get(protocol, "remote")
        raise MissingDependencyError("fsspec", extra, "reading a URL", path=url) from None
    return fsspec


def filesystem_key(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """What names the filesystem :func:`filesystem` gives for ``url`` and ``storage_options``:
    its protocol and a token of the options (two sets of options, two filesystems)."""
    protocol = url.partition("://")[0]
    token = _fsspec(url).utils.tokenize(protocol, dict(storage_options or {}))
    return protocol, token


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """This process's fsspec filesystem for ``url`` with ``storage_options`` (None: fsspec's
    own configuration) and the object's path in it; one per set of options, so two datasets
    with different credentials never share one."""
    fsspec = _fsspec(url)
    opts = dict(storage_options or {})
    key = filesystem_key(url, opts)
    protocol = key[0]
    with _FS_LOCK:
        held = _FILESYSTEMS.get()
        fs = held.get(key)
        if fs is None:
            if len(held) > 64:  # options no source uses any more
                held.clear()
            try:
                cls = fsspec.get_filesystem_class(protocol)
            except ImportError as exc:
                raise MissingDependencyError(
                    str(exc.name or protocol),
                    _EXTRAS.get(protocol, "remote"),
                    f"reading {protocol}:// URLs",
                    path=url,
                ) from None
            fs = cls(**opts, skip_instance_cache=True)
            held[key] = fs
    return fs, fs._strip_protocol(url)
