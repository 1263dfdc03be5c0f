"""The corpus worker: a subprocess that reads case files and reports JSON outcomes per case.

Started by :func:`corpus.corpus_run.run_corpus` as ``python -m corpus.corpus_worker MANIFEST OUT
MEMORY CPU`` (with ``tests/`` on its path). It imports what it tests, then
limits itself (``RLIMIT_AS`` to ``MEMORY`` bytes, ``RLIMIT_CPU`` to ``CPU`` more seconds, and
:data:`CASE_SECONDS` of CPU per path with ``ITIMER_PROF``) and, per case, tries:

``load``
    :func:`pickleshard.read.whole.load.load_records` (every appended pickle).
``scan:<engine>``
    :func:`pickleshard.scan.scan_file` with each available engine, then
    :meth:`~pickleshard.read.SpanReader.read_sample` of every sample (span rewrite of the
    same engine, globals restricted to the allowlist).
``scan:general``
    the python scan read by the pure-Python general span path (the fast path's oracle), for
    files up to 64 KiB.
``stale:<engine>``
    truncated and bit-flipped cases only: the spans of the valid original, read from the
    damaged bytes, as after a file changed since it was indexed (no value is checked).
``index``
    :func:`pickleshard.build_index` over the case's folder (spans, or whole when refused).
``dataset``
    every sample of :class:`~pickleshard.PickleDataset` over that index, when it was built.

The reference is ``pickle.load`` under the same allowlist, one call per appended pickle. A path
*passes* when it returns a result equal to the reference, or raises a
:class:`~pickleshard.errors.PickleshardError` whose message names the file. Anything else is a
*problem*: another exception, a message without the file name, a value that differs, a result
where the reference failed, the scanner engines disagreeing, or the canary file existing.

It writes one JSON line per case, ``{"case", "outcomes": {path: class name or "ok"},
"problems": [...], "seconds"}``, preceded by a ``{"start": case}`` line so that a case that
kills it is named.
"""

from __future__ import annotations

import bz2
import dataclasses
import faulthandler
import gzip
import json
import lzma
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

# Everything a path runs is imported here, before the worker limits its memory and CPU time.
from pickleshard.dataset import PickleDataset
from pickleshard.errors import PickleshardError
from pickleshard.indexing.build import build_index
from pickleshard.picklekit import walk
from pickleshard.read import SpanReader
from pickleshard.read.whole.load import load_records
from pickleshard.safety.policy import DEFAULT_POLICY
from pickleshard.scan import scan_file
from pickleshard.testing.oracle import reference_samples

from .diff import deep_diff
from .fault_worker import FaultWorker

__all__ = ["CASE_SECONDS", "ORIGINAL"]

ORIGINAL = "original.bin"  # beside a damaged case file: the valid file it was made from
CASE_SECONDS = 20
GENERAL_MAX_BYTES = 64 << 10  # the pure-Python span path is slow on the 100k-deep files


class _CaseTimeout(BaseException):
    pass


class _NotRun(Exception):
    """The path does not apply to this case (no index to read)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _CaseTimeout


def _engines() -> list[str]:
    """The scanner engines to try: the pure-Python walker, and the compiled one when built."""
    return ["python"] + (["compiled"] if walk.compiled_walker() is not None else [])


def _decompressed(path: str) -> Any:
    """``path`` opened for reading, decompressed by the standard library when its magic says
    gzip, bz2 or xz (pickleshard reads those decompressed; this oracle does not use its code)."""
    with open(path, "rb") as fh:
        head = fh.read(6)
    for magic, opener in ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ", lzma.open)):
        if head.startswith(magic):
            return opener(path, "rb")
    return open(path, "rb")


def _reference(path: str) -> tuple[list[Any] | None, str]:
    """Every pickle of ``path`` loaded one after another under the default allowlist."""
    objs = []
    try:
        with _decompressed(path) as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(0)
            while True:
                objs.append(DEFAULT_POLICY.unpickler(fh, path).load())
                if fh.tell() >= size:
                    return objs, ""
    except BaseException as exc:
        if isinstance(exc, _CaseTimeout):
            raise
        return None, type(exc).__name__


class _Worker:
    def __init__(self, index_dir: str, canary: str) -> None:
        self.index_dir, self.canary = index_dir, canary
        self.engines = _engines()
        self._originals: dict[tuple[str, bytes], Any] = {}
        self.built = False

    def run(self, name: str, folder: str, out: Any) -> None:
        files = sorted(os.listdir(folder))
        path = os.path.join(folder, next(f for f in files if f != ORIGINAL))
        original = os.path.join(folder, ORIGINAL) if ORIGINAL in files else None
        out.write(json.dumps({"start": name}) + "\n")
        out.flush()
        t0 = time.perf_counter()
        outcomes: dict[str, str] = {}
        problems: list[str] = []
        ref, ref_error = _reference(path)
        paths: list[tuple[str, Callable[[], str | None]]] = [
            ("load", lambda: self._load(path, ref)),
        ]
        general = ["general"] if os.path.getsize(path) <= GENERAL_MAX_BYTES else []
        for engine in [*self.engines, *general]:
            paths.append((f"scan:{engine}", partial(self._scan, path, ref, ref_error, engine)))
        if original is not None:
            for engine in self.engines:
                paths.append((f"stale:{engine}", partial(self._stale, path, original, engine)))
        paths.append(("index", lambda: self._index(folder, ref)))
        paths.append(("dataset", lambda: self._dataset(folder, path, ref, ref_error)))
        for label, fn in paths:
            signal.setitimer(signal.ITIMER_PROF, CASE_SECONDS)
            try:
                problem = fn()
                outcomes[label] = "ok"
                if problem:
                    problems.append(f"{label}: {problem}")
            except _NotRun:
                outcomes[label] = "not run"
            except PickleshardError as exc:
                outcomes[label] = type(exc).__name__
                if getattr(exc, "offset", None) is None and getattr(exc, "sample", None) is None:
                    outcomes[label] += " (no offset)"
                if path not in str(exc) and folder not in str(exc):
                    problems.append(f"{label}: message does not name the file: {exc}")
            except _CaseTimeout:
                outcomes[label] = "timeout"
                problems.append(f"{label}: no answer within {CASE_SECONDS} s of CPU time")
            except BaseException as exc:
                outcomes[label] = f"escaped {type(exc).__name__}"
                problems.append(f"{label}: {type(exc).__name__} escaped: {str(exc)[:300]}")
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            if os.path.exists(self.canary):
                problems.append(f"{label}: the canary file was created")
                os.unlink(self.canary)
        twins = {outcomes[f"scan:{e}"] for e in self.engines}
        if len(twins) > 1:
            problems.append(f"the scanner engines disagree: {sorted(twins)}")
        outcomes["reference"] = ref_error or "ok"
        took = round(time.perf_counter() - t0, 4)
        rec = {"case": name, "outcomes": outcomes, "problems": problems, "seconds": took}
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def _load(self, path: str, ref: list[Any] | None) -> str | None:
        got = load_records(path)
        if ref is None:
            return "load_records succeeds, but pickle.load fails"
        diff = deep_diff(got, ref)
        return f"value differs from pickle.load at {diff}" if diff else None

    def _scan(self, path: str, ref: list[Any] | None, ref_error: str, engine: str) -> str | None:
        """``engine`` "general": the python scan read by the pure-Python general span path."""
        general = engine == "general"
        engine = "python" if general else engine
        scan = scan_file(path, engine=engine)
        want: list[Any] | None = None
        if ref is not None:
            fields, want = reference_samples(ref, path)
            if fields != scan.fields:
                return f"fields {scan.fields} != {fields} of pickle.load"
            if len(want) != scan.num_samples:
                return f"{scan.num_samples} samples, pickle.load gives {len(want)}"
        # restricted to the allowlist by default
        with SpanReader(scan, engine=engine, general=general) as reader:
            for i in range(scan.num_samples):
                got = reader.read_sample(i)
                if want is not None:
                    diff = deep_diff(got, want[i])
                    if diff:
                        return f"sample {i} differs from pickle.load at {diff}"
        if want is None and ref_error != "MemoryError":  # spans renumber huge memo ids
            return f"every span reads, but pickle.load of the whole file fails ({ref_error})"
        return None

    def _stale(self, path: str, original: str, engine: str) -> str | None:
        """Spans of the valid original read from the damaged bytes (a file changed after
        indexing): every sample must read or raise a package error; values are not checked."""
        with open(original, "rb") as fh:
            key = (engine, fh.read())
        if key not in self._originals:  # a few dozen originals, each damaged many ways
            self._originals[key] = scan_file(original, engine=engine)
        scan = dataclasses.replace(self._originals[key], path=path)
        with SpanReader(scan, engine=engine) as reader:
            for i in range(scan.num_samples):
                reader.read_sample(i)
        return None

    def _index(self, folder: str, ref: list[Any] | None) -> str | None:
        self.built = False
        build_index(folder, index=self.index_dir, jobs=1)
        self.built = True  # without unpickling in span mode: a bad payload shows when read
        return None

    def _dataset(self, folder: str, path: str, ref: list[Any] | None, ref_error: str) -> str | None:
        """Every sample through :class:`~pickleshard.PickleDataset` over the index just built."""
        if not self.built:
            raise _NotRun
        ds = PickleDataset(folder, index=self.index_dir, rebuild="never")
        want = reference_samples(ref, path)[1] if ref is not None else None
        for i in range(len(ds)):
            got = ds[i]
            if isinstance(got, dict):  # a dict producer's sample: its values in field order
                if tuple(got) != ds.fields:
                    return f"sample {i} is a dict keyed {tuple(got)}, not by {ds.fields}"
                got = tuple(got.values())
            if want is not None:
                diff = deep_diff(got, want[i])
                if diff:
                    return f"sample {i} ({ds.index.files[0].mode}) differs from pickle.load: {diff}"
        if want is None and ref_error != "MemoryError":
            return f"every sample reads, but pickle.load of the whole file fails ({ref_error})"
        return None


def _limit(memory: int, cpu: int) -> None:
    """At most ``memory`` bytes of address space, and ``cpu`` more CPU seconds from now."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (used + cpu, used + cpu + 5))


def _worker_main(manifest: str, out_path: str, memory: int, cpu: int) -> None:
    faulthandler.enable()
    spec = json.loads(Path(manifest).read_text())
    worker: Any
    if spec.get("suite") == "faults":
        worker = FaultWorker(spec["work_dir"], spec["canary"], spec["run_seconds"])
    else:
        worker = _Worker(spec["index_dir"], spec["canary"])
    _limit(memory, cpu)
    signal.signal(signal.SIGPROF, _on_alarm)
    with open(out_path, "a") as out:
        for name, folder in spec["cases"]:
            worker.run(name, folder, out)


if __name__ == "__main__":
    _worker_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
