"""A pickled pandas DataFrame or Series (``df.to_pickle``): one sample per row.

A DataFrame becomes the ``dict_columns`` layout: one field per column, named by the column
(as text), its values ``df.iloc[:, j].to_numpy()``; a Series is one field named by the
Series (``"x"`` when it has no name). Sample ``i`` is then
``tuple(df.iloc[:, j].to_numpy()[i] for j in ...)``. The index is not a field (``reset_index()``
before pickling keeps it). Unpickling the frame needs the ``allow="pandas"`` preset
(:data:`pickleshard.safety.allowlist.PRESETS`); pandas is recognised by the object the bytes rebuilt,
never by the file name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import UnsupportedLayoutError

__all__ = ["as_columns", "unwrap_tables"]


def as_columns(obj: Any, path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``obj`` as a dict of columns when it is a DataFrame or Series, else None."""
    pd = sys.modules.get("pandas")  # a DataFrame was unpickled only if pandas was imported
    if pd is None:
        return None
    if isinstance(obj, pd.Series):
        return {"x" if obj.name is None else str(obj.name): obj.to_numpy()}
    if not isinstance(obj, pd.DataFrame):
        return None
    names = [str(c) for c in obj.columns]
    if len(set(names)) != len(names):
        raise UnsupportedLayoutError(
            path, f"DataFrame with repeated column names {names}: rename them to read rows"
        )
    return {name: obj.iloc[:, j].to_numpy() for j, name in enumerate(names)}


def unwrap_tables(records: Sequence[Any], path: str | os.PathLike[str]) -> list[Any]:
    """``records`` (a file's unpickled pickles) with each DataFrame or Series as its columns."""
    out = []
    for r in records:
        cols = as_columns(r, path)
        out.append(r if cols is None else cols)
    return out
