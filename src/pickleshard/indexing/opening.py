"""Opening the index of a dataset as the dataset does: checked against the files on disk, and
built or rebuilt as the ``rebuild`` policy says."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ..errors import IndexFormatError, StaleIndexError
from ..executors import ExecutorLike
from ..index.model import DatasetIndex
from ..index.ondisk import FORMAT_NAME, default_index_path, is_older, read_header
from ..io.listing import ResolvedSource, Source, resolve_source
from ..io.options import SourceOptions, source_options
from ..safety.policy import DEFAULT_POLICY, UnpicklePolicy
from ..scan.layouts import LayoutChoice, check_layout_choice
from .build import build_index

__all__ = ["Rebuild", "open_index"]

Rebuild = Literal["missing", "auto", "never"]


def open_index(
    source: Source,
    *,
    index: str | os.PathLike[str] | None = None,
    rebuild: Rebuild = "missing",
    jobs: int | None = None,
    progress: bool = False,
    policy: UnpicklePolicy = DEFAULT_POLICY,
    skip_bad: bool = False,
    executor: ExecutorLike = None,
    layout: LayoutChoice = "auto",
    storage_options: Mapping[str, Any] | SourceOptions | None = None,
) -> tuple[DatasetIndex, ResolvedSource]:
    """Open the index of ``source``, checking it against the files on disk.

    ``rebuild="missing"`` (default) builds an index that does not exist yet, or that an older
    pickleshard wrote in an older format, and raises :class:`StaleIndexError` on a stale one
    and :class:`IndexFormatError` on a damaged or edited one (every part of an index is
    checked when it is opened, see :mod:`pickleshard.index.validate`); ``"auto"`` also rebuilds a
    stale or a damaged one; ``"never"`` only opens. What counts as changed is
    :meth:`DatasetIndex.stale_files`' rule (a copied dataset's files all do; a moved one's do
    not). ``jobs``, ``progress``, ``policy``, ``skip_bad`` and ``executor`` are passed to
    :func:`build_index` when it builds; ``storage_options`` (a URL's) list, check and index its
    objects, and the resolved source returned carries them.

    ``layout`` is what a file or record is (:data:`pickleshard.scan.layouts.LAYOUT_CHOICES`):
    an index built with another is rebuilt (``"missing"``, ``"auto"``), or refused with
    :class:`IndexFormatError` (``"never"``).
    """
    layout = check_layout_choice(layout)
    if rebuild not in ("missing", "auto", "never"):
        raise ValueError(f"rebuild must be 'missing', 'auto' or 'never', got {rebuild!r}")
    options = source_options(storage_options)
    resolved = resolve_source(source, options)
    index_dir = Path(index) if index is not None else default_index_path(resolved)
    kwargs: dict[str, Any] = {
        "index": index_dir,
        "jobs": jobs,
        "progress": progress,
        "policy": policy,
        "skip_bad": skip_bad,
        "executor": executor,
        "layout": layout,
        "storage_options": options,
    }
    if rebuild != "never":
        if not (index_dir / "index.json").exists():
            return build_index(source, **kwargs), resolved
        try:
            stored = read_header(index_dir)
        except IndexFormatError:
            stored = {}
        if stored.get("format") == FORMAT_NAME and is_older(stored.get("version")):
            return build_index(source, **kwargs), resolved
        if stored and stored.get("layout_choice", "auto") != layout:  # another reading
            return build_index(source, **kwargs), resolved
    try:
        opened = DatasetIndex.open(index_dir)
    except IndexFormatError:
        if rebuild != "auto":
            raise
        return build_index(source, **kwargs), resolved  # damaged or edited: built afresh
    built_as = opened.header.get("layout_choice", "auto")
    if built_as != layout:
        raise IndexFormatError(
            index_dir / "index.json",
            f"built with layout={built_as!r}, not layout={layout!r}; rebuild it "
            f"(`pickleshard index --layout {layout}`, or rebuild='auto')",
        )
    try:
        opened.check(resolved)
    except StaleIndexError:
        if rebuild != "auto":
            raise
        return build_index(source, **kwargs), resolved
    return opened, resolved
