"""Validation of ``index.json`` read from disk: it is untrusted input, like the data it describes.

An index shipped with a downloaded dataset can be edited as easily as the pickles. Every read
path trusts what :class:`~pickleshard.index.DatasetIndex` hands it (offsets it ``pread``\\ s,
dtypes and shapes it allocates, memo ids it renumbers, rows it slices), so every part is
checked once, when the index is opened, and a violation raises
:class:`~pickleshard.errors.IndexFormatError` naming the index file and what is wrong. This
module checks the header (:func:`check_header`): types and ranges of every header, files-table
and skipped-files entry (``bool`` is not an int, a count is not a string); file paths relative
and inside the dataset directory, each named once; array file names plain names of the index
directory; counts that add up (files, samples, modes); the rows each span file takes in the
span arrays exactly where the builder puts them (rows can be neither shared nor moved between
files). Each span file's scan descriptor is checked by :mod:`pickleshard.index.validate_scan`;
the ``.npy`` files and their contents against the header by :mod:`pickleshard.index.arrays` and
:mod:`pickleshard.index.contents`.

What the index alone cannot tell (a span's bytes edited with it) is the read path's business:
:mod:`pickleshard.read` checks one sample of each array field against a real unpickling
(and, with issue 12's read-time checks, every payload's framing).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from ..errors import UnsupportedLayoutError
from ..scan.sampleform import SampleForm
from .checking import (
    MAX_ID,
    FieldCheck,
    IndexProblem,
    show,
    want_dict,
    want_int,
    want_list,
    want_str,
)
from .files import FileEntry
from .ondisk import ARRAY_NAME, SPAN_ARRAYS
from .validate_scan import check_file_notes, check_scan_meta

__all__ = ["check_header"]


def _rel_path(v: Any, what: str) -> str:
    """A dataset file's path: relative, normalised, inside the dataset directory."""
    want_str(v, what)
    parts = PurePosixPath(v).parts
    if (
        not v
        or "\0" in v
        or "\\" in v
        or v.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
        or "/".join(parts) != v
    ):
        raise IndexProblem(
            "index.json", f"{what} {v!r} is not a plain relative path inside the dataset"
        )
    return str(v)


_FILE_KEYS = set(FileEntry.__dataclass_fields__)
_SKIP_KEYS = {"path", "error", "message", "size", "mtime_ns", "ctime_ns", "ino"}


def _file_entry(obj: Any, k: int, fields: list[str]) -> tuple[FileEntry, tuple[FieldCheck, ...]]:
    at = f"files[{k}]"
    row = want_dict(obj, at)
    extra, missing = set(row) - _FILE_KEYS, {"path", "size", "mode", "ctime_ns", "ino"} - set(row)
    if extra or missing:
        raise IndexProblem("index.json", f"{at} has keys {sorted(extra)} / lacks {sorted(missing)}")
    _rel_path(row["path"], f"{at}.path")
    for key in ("size", "num_samples", "decoded_nbytes"):
        want_int(row.get(key), f"{at}.{key}", hi=(1 << 32) - 1 if key == "num_samples" else MAX_ID)
    want_int(row.get("mtime_ns"), f"{at}.mtime_ns", lo=-MAX_ID)
    # required (every version since 3 writes them): without them the staleness check rests on
    # size, mtime and fingerprint alone, which an archive carries to any machine, so an edited
    # index would pass for fresh next to a downloaded dataset
    remote = row.get("etag") is not None  # a remote object: its ETag stands for ctime, inode
    want_int(row.get("ctime_ns"), f"{at}.ctime_ns", lo=-MAX_ID, none=remote)
    want_int(row.get("ino"), f"{at}.ino", none=remote)
    for key in ("fingerprint", "layout"):
        want_str(row.get(key), f"{at}.{key}")
    want_str(row.get("reason"), f"{at}.reason", none=True)
    want_str(row.get("etag"), f"{at}.etag", none=True)
    check_file_notes(row.get("metadata"), row.get("ambiguity"), at)
    if row.get("fields") != fields:
        raise IndexProblem("index.json", f"{at}.fields is {show(row.get('fields'))}, not {fields}")
    mode = row["mode"]
    if mode not in ("span", "whole"):
        raise IndexProblem("index.json", f"{at}.mode is {show(mode)}, expected 'span' or 'whole'")
    for key in ("span_row", "ext_row", "record_row"):
        want_int(row.get(key, -1), f"{at}.{key}", lo=-1)
    if mode == "whole" and (row.get("scan") is not None or row.get("span_row", -1) != -1):
        raise IndexProblem("index.json", f"{at} is read whole but names span rows")
    checks: tuple[FieldCheck, ...] = ()
    if mode == "span":
        checks = check_scan_meta(
            row.get("scan"), f"{at}.scan", row["size"], len(fields), row["num_samples"]
        )
    return FileEntry.from_json(row), checks


def check_header(
    header: dict[str, Any],
) -> tuple[list[FileEntry], list[dict[str, Any]], list[tuple[FieldCheck, ...]]]:
    """The files table and skipped files of a header of the current version, checked; raises
    ``IndexProblem``. The array names and checksums are checked too (not the arrays themselves)."""
    fields = want_list(header.get("fields"), "fields")
    if not all(type(f) is str for f in fields) or len(set(fields)) != len(fields):
        raise IndexProblem("index.json", f"fields {show(fields)} are not distinct strings")
    files_json = want_list(header.get("files"), "files")
    files: list[FileEntry] = []
    checks: list[tuple[FieldCheck, ...]] = []  # per span file
    for k, obj in enumerate(files_json):
        entry, check = _file_entry(obj, k, fields)
        files.append(entry)
        if entry.mode == "span":
            checks.append(check)
    skipped = want_list(header.get("skipped", []), "skipped")
    for k, s in enumerate(skipped):
        at = f"skipped[{k}]"
        if set(want_dict(s, at)) != _SKIP_KEYS and set(s) != _SKIP_KEYS - {"ctime_ns", "ino"}:
            raise IndexProblem("index.json", f"{at} has keys {sorted(s)}")
        _rel_path(s["path"], f"{at}.path")
        want_str(s["error"], f"{at}.error")
        want_str(s["message"], f"{at}.message")
        for key in ("size", "mtime_ns", "ctime_ns", "ino"):
            want_int(s.get(key), f"{at}.{key}", lo=-MAX_ID, none=True)
    paths = [f.path for f in files] + [s["path"] for s in skipped]
    if len(set(paths)) != len(paths):
        raise IndexProblem("index.json", "a file is listed twice")
    n = sum(f.num_samples for f in files)
    if header.get("num_samples") != n or header.get("num_files") != len(files):
        raise IndexProblem(
            "index.json",
            f"num_samples {show(header.get('num_samples'))} / num_files "
            f"{show(header.get('num_files'))} disagree with the files table ({n} / {len(files)})",
        )
    modes = {m: sum(f.mode == m for f in files) for m in ("span", "whole")}
    if header.get("modes") != modes:
        raise IndexProblem(
            "index.json", f"modes {show(header.get('modes'))}, the files table has {modes}"
        )
    if header.get("layout_choice", "auto") not in ("auto", "columns", "records", "file"):
        raise IndexProblem("index.json", f"layout_choice is {show(header.get('layout_choice'))}")
    layout = want_list(header.get("layout"), "layout")
    if not all(type(x) is str for x in layout):
        raise IndexProblem("index.json", "layout is not a list of strings")
    _check_form(header.get("sample_form"), files, fields)
    _check_placement(files, len(fields))
    names = want_dict(header.get("arrays"), "arrays")
    sums = want_dict(header.get("checksums"), "checksums")
    wanted = {"samples", *SPAN_ARRAYS}
    if set(names) != wanted or set(sums) != wanted:
        raise IndexProblem(
            "index.json", f"arrays/checksums name {sorted(names)}, expected {sorted(wanted)}"
        )
    for key, name in names.items():
        if type(name) is not str or not ARRAY_NAME.fullmatch(name):
            raise IndexProblem(
                "index.json", f"arrays.{key} {show(name)} is not a file of the index"
            )
        if type(sums[key]) is not str or not re.fullmatch(r"crc32:[0-9a-f]{8}", sums[key]):
            raise IndexProblem("index.json", f"checksums.{key} is {show(sums[key])}")
    if len(set(names.values())) != len(names):
        raise IndexProblem("index.json", "two arrays share a file")
    total = sum(f.size + 1 for f in files)  # the array checks add sizes up in int64
    if total >= MAX_ID or sum(f.decoded_nbytes for f in files) >= MAX_ID:
        raise IndexProblem("index.json", "file sizes add up to more than any dataset holds")
    return files, skipped, checks


def _check_form(stored: Any, files: list[FileEntry], fields: list[str]) -> None:
    """The samples' form is the one the files' layouts give (an edited one would hand out
    samples of another type than the producer's)."""
    try:
        form = SampleForm.of_layouts((f.layout for f in files), fields)
    except UnsupportedLayoutError:
        names = sorted({f.layout for f in files})
        raise IndexProblem(
            "index.json", f"the files table names an unknown layout: {names}"
        ) from None
    if stored != form.kind:
        raise IndexProblem(
            "index.json",
            f"sample_form is {show(stored)}, but the files' layouts give {form.kind!r}",
        )


def _check_placement(files: list[FileEntry], nf: int) -> None:
    """Each span file's first rows are where the builder puts them: right after the previous
    span file's (so rows can be neither shared nor moved between files)."""
    row = ext = rec = 0
    for k, e in enumerate(files):
        if e.mode != "span":
            continue
        assert e.scan is not None
        if (e.span_row, e.ext_row, e.record_row) != (row, ext, rec):
            raise IndexProblem(
                "index.json",
                f"files[{k}] ({e.path}) starts at span/ext/record rows "
                f"{(e.span_row, e.ext_row, e.record_row)}, expected {(row, ext, rec)}",
            )
        row, ext, rec = (
            row + e.num_samples,
            ext + e.num_samples * nf + 1,
            rec + e.scan["num_records"],
        )
