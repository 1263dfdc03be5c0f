"""Datasets under a URL: the pickle objects under a prefix, listed through fsspec, and where
their index lives (locally, keyed by the URL: a bucket is rarely writable, and never cheaply).

``s3://bucket/prefix/`` lists every object under the prefix whose name matches the pickle
patterns (:func:`pickleshard.io.filenames.is_pickle_name`); a URL with glob characters is expanded by the filesystem's ``glob``; a URL naming one
object is that file. The root every file is stored relative to is a :class:`URLPath`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ...errors import DatasetNotFoundError, NoPickleFilesError, RemoteStorageError
from ..filenames import PICKLE_PATTERNS, is_pickle_name
from ..options import SourceOptions
from ..resolved import ResolvedSource
from .known import remember_info
from .source import filesystem, filesystem_key, is_url

__all__ = [
    "URLPath",
    "is_url",
    "remote_index_path",
    "resolve_url",
    "resolve_urls",
    "without_credentials",
]

INDEX_HOME_ENV = "PICKLESHARD_INDEX_HOME"


class URLPath(str):
    """A URL that joins like a path: ``URLPath("s3://b/p") / "x.pkl"`` is ``"s3://b/p/x.pkl"``.
    ``os.fspath`` gives the URL itself."""

    def __truediv__(self, rel: str | os.PathLike[str]) -> URLPath:
        return URLPath(f"{self.rstrip('/')}/{os.fspath(rel).lstrip('/')}")

    def __fspath__(self) -> str:
        return str(self)


def _protocol_url(protocol: str, path: str) -> str:
    return path if "://" in path else f"{protocol}://{path.lstrip('/')}"


def _listing_error(url: str, exc: Exception) -> Exception:
    if isinstance(exc, PermissionError) or getattr(exc, "status", 0) in (401, 403):
        return RemoteStorageError(
            url,
            f"access denied listing it: {type(exc).__name__}: {str(exc)[:200]}; check the "
            "credentials (storage_options or the fsspec/boto configuration)",
        )
    return RemoteStorageError(url, f"cannot list it: {type(exc).__name__}: {str(exc)[:200]}")


def _storage(options: SourceOptions | None) -> dict[str, Any] | None:
    return None if options is None else options.storage_options


def resolve_url(
    url: str, index_dirname: str, options: SourceOptions | None = None
) -> ResolvedSource:
    """The pickle objects ``url`` names (see the module docstring), listed with ``options``'
    storage options (None: fsspec's own configuration), as a resolved source."""
    fs, path = filesystem(url, _storage(options))
    protocol = url.partition("://")[0]
    try:
        if any(c in path for c in "*?["):
            found = [p for p in fs.glob(path) if fs.isfile(p)]
            if not found:
                raise NoPickleFilesError(url, [url])
            return _from_objects(protocol, found)
        if fs.isdir(path):
            names = sorted(
                p
                for p in fs.find(path)
                if f"/{index_dirname}/" not in p and is_pickle_name(p.rsplit("/", 1)[-1])
            )
            if not names:
                raise NoPickleFilesError(url, PICKLE_PATTERNS)
            root = URLPath(url.rstrip("/"))
            base = path.rstrip("/") + "/"
            rel = tuple(p[len(base) :] if p.startswith(base) else p for p in names)
            return ResolvedSource(root, rel, True)  # type: ignore[arg-type]
        if fs.isfile(path):
            return _from_objects(protocol, [path])
    except (NoPickleFilesError, DatasetNotFoundError):
        raise
    except FileNotFoundError:
        pass
    except Exception as exc:
        raise _listing_error(url, exc) from None
    raise DatasetNotFoundError(url, "object or prefix")


def resolve_urls(urls: Sequence[str], options: SourceOptions | None = None) -> ResolvedSource:
    """A list of object URLs as a resolved source; each must name an existing object (looked
    up with ``options``' storage options; what each lookup said is kept a few seconds for its
    open, :mod:`~pickleshard.io.remote.known`)."""

    def check(url: str) -> None:
        fs, path = filesystem(url, _storage(options))
        try:  # info, not isfile: HTTP's isfile is a GET of the whole object
            meta = fs.info(path)
            found = meta.get("type", "file") == "file"
            # kept: the object's open (an index build's) takes it instead of asking again
            remember_info(filesystem_key(url, _storage(options)), path, meta)
        except FileNotFoundError:
            found = False
        except Exception as exc:
            raise _listing_error(url, exc) from None
        if not found:
            raise DatasetNotFoundError(url, "object")

    # concurrently: one round trip for the list, not one per object (errors in list order)
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(urls)))) as pool:
        list(pool.map(check, urls))
    return _from_objects("", list(urls))


def _from_objects(protocol: str, paths: Sequence[str]) -> ResolvedSource:
    urls = sorted(_protocol_url(protocol, p) for p in paths)
    parents = [u.rsplit("/", 1)[0] for u in urls]
    parts = [p.split("/") for p in parents]
    shared = next(
        (k for k in range(min(map(len, parts))) if len({q[k] for q in parts}) > 1),
        min(map(len, parts)),
    )
    common = "/".join(parts[0][:shared])  # whole components: never cut inside a name
    rel = tuple(u[len(common) + 1 :] for u in urls)
    return ResolvedSource(URLPath(common), rel, False)  # type: ignore[arg-type]


def without_credentials(location: str) -> str:
    """``location`` with a URL's ``user:password@`` and its query and fragment (where signed
    URLs carry their tokens) taken out: what an index or a converted dataset records. A local
    path is returned as it is."""
    if not is_url(location):
        return location
    parts = urlsplit(location)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def remote_index_path(source: ResolvedSource) -> Path:
    """Where the index of a dataset under a URL lives by default: a local folder keyed by the
    URL and the file list, under ``$PICKLESHARD_INDEX_HOME`` (default
    ``~/.cache/pickleshard/remote``). The URL is only hashed; the folder's name shows its host
    without any ``user:password@``."""
    home = os.environ.get(INDEX_HOME_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pickleshard", "remote"
    )
    root = os.fspath(source.root)
    key = hashlib.blake2b(
        "\n".join([root, *([] if source.is_directory else source.files)]).encode(),
        digest_size=10,
    ).hexdigest()
    host = root.partition("://")[2].split("/", 1)[0].rpartition("@")[2]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)[:40]
    return Path(home) / f"{safe}-{key}"
