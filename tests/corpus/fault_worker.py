"""The fault worker: runs one (fault case, entry point) at a time and classifies the outcome.

:func:`corpus.corpus_run.run_corpus` (``suite="faults"``) starts it through
:mod:`corpus.corpus_worker`, under the same memory and CPU limits, with one run
per ``"<case>::<entry point>"``. Each run gets a fresh folder
(:func:`~corpus.fault_setup.materialise`), has :data:`RUN_SECONDS` of wall clock
(``SIGALRM``; the runner kills a worker that does not answer at all), and ends in one class:

``ok-correct``
    the samples equal :func:`pickle.load` of the files (each equals the old or the new value,
    for a file rewritten during the epoch); for ``index`` and ``inspect``, a zero exit.
``ok-error``
    a :class:`~pickleshard.errors.PickleshardError` whose message names the file (a path in
    the case's data folder, or where a symlink points); for the CLI a nonzero exit whose stderr
    is one line ``pickleshard: error: ...`` naming it (``inspect --strict``: exit 3).
``WRONG``
    other samples than ``pickle.load`` gives, samples (or a zero exit of ``inspect --strict``,
    ``convert``, ``split``, ``verify``) for a case that must be refused, an allowlisted
    function changed after the run, or the canary file created.
``HANG``
    no answer within the wall-clock limit (the runner adds a worker killed for it, and one
    killed by its CPU limit).
``FOREIGN``
    any other exception, a package error that does not name the file, a traceback, or CLI
    stderr that is not one error line.
``n/a``
    ``verify`` when ``convert`` (which makes its input) refused the case.

``CRASH`` (the worker died of a signal) is the runner's to record. A run writes one JSON line,
``{"case": "<case>::<entry point>", "outcomes": {entry point: class}, "problems": [...]}``.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from pickleshard.errors import PickleshardError

from .diff import deep_diff
from .fault_entries import ENTRIES, CliResult, FaultRun, Samples

__all__ = ["CLASSES", "ENTRY_POINTS", "META", "NOT_OK", "RUN_SECONDS", "FaultWorker"]

META = "case.json"  # beside a fault case's data file: family, expect, setup, extra files
RUN_SECONDS = 20
CLASSES = ("ok-correct", "ok-error", "WRONG", "CRASH", "HANG", "FOREIGN", "n/a")
NOT_OK = ("WRONG", "CRASH", "HANG", "FOREIGN")
ENTRY_POINTS = tuple(ENTRIES)


class _Hang(BaseException):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Hang


# -- classification ---------------------------------------------------------------------------


def _check_samples(
    run: FaultRun, got: Samples, what: str, versions: list[list[Any]] | None = None
) -> tuple[str, str]:
    if run.meta["expect"] == "refuse":
        return "WRONG", f"{what} {len(got)} samples of a case that must be refused"
    versions = versions or run.versions
    n = len(versions[0])
    if run.rewrite is None and len(got) != n:
        return "WRONG", f"{what} {len(got)} samples, pickle.load gives {n}"
    for i, sample in got:
        if not 0 <= i < n:
            return "WRONG", f"sample index {i} out of {n}"
        diffs = [deep_diff(sample, v[i]) for v in versions]
        if all(diffs):
            which = "the old or the new value" if run.rewrite else "pickle.load"
            return "WRONG", f"sample {i} is not {which}: {diffs[0]}"
    return "ok-correct", ""


def _classify_cli(run: FaultRun, ep: str, res: CliResult) -> tuple[str, str]:
    lines = res.err.strip().splitlines()
    if "Traceback" in res.err:
        return "FOREIGN", f"exit {res.rc}, a traceback on stderr: {_one_line(res.err[-400:])}"
    if res.rc == 0:
        if ep == "cli:inspect-strict" and run.meta["expect"] == "refuse":
            return "WRONG", "inspect --strict exits 0 on a case the loader must refuse"
        writes = ("cli:convert-memmap", "cli:convert-lmdb", "cli:convert-webdataset", "cli:split")
        if run.meta["expect"] == "refuse" and (ep in writes or ep == "cli:verify"):
            return "WRONG", f"{ep[4:]} exits 0 on a case that must be refused"
        if ep in writes:
            return _check_samples(run, res.samples, f"{ep} wrote", res.versions)
        return "ok-correct", ""
    if ep == "cli:inspect-strict" and res.rc == 3:
        return "ok-error", f"exit 3: {_one_line(res.err)}"
    if len(lines) == 1 and lines[0].startswith("pickleshard: error: "):
        if run.names_file(lines[0]):
            return "ok-error", f"exit {res.rc}: {_one_line(lines[0])}"
        return "FOREIGN", f"exit {res.rc}, the error does not name the file: {lines[0][:300]}"
    return "FOREIGN", f"exit {res.rc}, stderr is not one error line: {res.err[-400:]!r}"


def _classify_exception(run: FaultRun, exc: BaseException) -> tuple[str, str]:
    text = str(exc)
    if isinstance(exc, PickleshardError):
        if run.names_file(text):
            return "ok-error", f"{type(exc).__name__}: {_one_line(text)}"
        return "FOREIGN", f"{type(exc).__name__} does not name the file: {text[:300]}"
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" at {where[0].filename}:{where[0].lineno}" if where else ""
    return "FOREIGN", f"{type(exc).__name__}{at}: {_one_line(text)}"


def _one_line(text: str, limit: int = 300) -> str:
    return " | ".join(line for line in text.strip().splitlines() if line.strip())[:limit]


class _Globals:
    """What a ``BUILD`` on an allowlisted global could change, snapshotted at start."""

    def __init__(self) -> None:
        import numpy._core.numeric as numeric
        import torch
        import torch._utils

        self.functions = {
            "torch._utils._rebuild_tensor_v2": torch._utils._rebuild_tensor_v2,
            "numpy._core.numeric._frombuffer": numeric._frombuffer,  # type: ignore[attr-defined]
        }
        self.saved = {n: self._state(f) for n, f in self.functions.items()}
        buf = io.BytesIO()
        torch.save(torch.arange(3.0), buf)
        self.tensor_bytes = buf.getvalue()

    @staticmethod
    def _state(f: Any) -> tuple[Any, ...]:
        return (f.__defaults__, f.__kwdefaults__, dict(f.__dict__), f.__code__)

    def check_and_restore(self) -> str:
        """What changed (restored at once), or ""."""
        import torch

        changed = []
        for name, f in self.functions.items():
            if self._state(f) != self.saved[name]:
                changed.append(f"{name} changed: __defaults__ {f.__defaults__!r}")
                f.__defaults__, f.__kwdefaults__, _, f.__code__ = self.saved[name]
                f.__dict__.clear()
                f.__dict__.update(self.saved[name][2])
        loaded = torch.load(io.BytesIO(self.tensor_bytes), weights_only=True)
        if not torch.equal(loaded, torch.arange(3.0)):
            changed.append(f"torch.load(weights_only=True) of arange(3) gives {loaded.tolist()}")
        arr = pickle.loads(pickle.dumps(np.arange(3.0), 5))
        if arr.tolist() != [0.0, 1.0, 2.0]:
            changed.append(f"pickle of np.arange(3) reads back as {arr.tolist()}")
        return "; ".join(changed)


class FaultWorker:
    """Runs ``"<case>::<entry point>"`` items (see the module docstring)."""

    def __init__(self, work_dir: str, canary: str, run_seconds: float = RUN_SECONDS) -> None:
        self.work_dir, self.canary = Path(work_dir), canary
        self.run_seconds = run_seconds
        self.globals = _Globals()
        self.runs = 0
        signal.signal(signal.SIGALRM, _on_alarm)

    def run(self, name: str, folder: str, out: Any) -> None:
        ep = name.split("::")[1]
        meta = json.loads((Path(folder) / META).read_text())
        out.write(json.dumps({"start": name}) + "\n")
        out.flush()
        self.runs += 1
        run_dir = self.work_dir / f"run-{os.getpid()}-{self.runs}"
        t0 = time.perf_counter()
        cls, detail = self._run(Path(folder), meta, run_dir, ep)
        changed = self.globals.check_and_restore()
        if changed:
            cls, detail = "WRONG", f"an allowlisted function changed: {changed}"
        if os.path.exists(self.canary):
            os.unlink(self.canary)
            cls, detail = "WRONG", "the canary file was created: the payload ran"
        shutil.rmtree(run_dir, ignore_errors=True)
        problems = [f"{cls}: {detail}"] if cls in NOT_OK else []
        took = round(time.perf_counter() - t0, 4)
        rec = {
            "case": name,
            "outcomes": {ep: cls},
            "problems": problems,
            "seconds": took,
            "detail": detail,
        }
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def _run(self, case_dir: Path, meta: dict[str, Any], run_dir: Path, ep: str) -> tuple[str, str]:
        signal.setitimer(signal.ITIMER_REAL, self.run_seconds)
        run: FaultRun | None = None
        try:
            run = FaultRun(case_dir, meta, run_dir)
            if ep.startswith("cli:"):
                run.begin()
            try:
                got = ENTRIES[ep](run)
            finally:
                run.end()
            signal.setitimer(signal.ITIMER_REAL, 0)
            if got is None:
                return "n/a", "convert refused the case"
            if isinstance(got, CliResult):
                return _classify_cli(run, ep, got)
            return _check_samples(run, got, "returned")
        except _Hang:
            return "HANG", f"no answer within {self.run_seconds} s"
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if run is None:
                return "FOREIGN", f"the case's setup failed: {type(exc).__name__}: {exc}"
            return _classify_exception(run, exc)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
