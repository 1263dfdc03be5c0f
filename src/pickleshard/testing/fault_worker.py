"""The fault worker: runs one (fault case, entry point) at a time and classifies the outcome.

:func:`pickleshard.testing.corpus_run.run_corpus` (``suite="faults"``) starts it through
:mod:`pickleshard.testing.corpus_worker`, under the same memory and CPU limits, with one run
per ``"<case>::<entry point>"``. Each run gets a fresh folder
(:func:`~pickleshard.testing.fault_setup.materialise`), has :data:`RUN_SECONDS` of wall clock
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

import contextlib
import io
import json
import os
import pickle
import shutil
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .corpus_worker import deep_diff
from .fault_setup import DATA_NAME, Rewriter, materialise
from .faults import REWRITE_NEW
from .oracle import reference_samples

__all__ = ["CLASSES", "ENTRY_POINTS", "META", "NOT_OK", "RUN_SECONDS", "FaultWorker"]

META = "case.json"  # beside a fault case's data file: family, expect, setup, extra files
RUN_SECONDS = 20
REWRITE_EPOCHS = 12
CLASSES = ("ok-correct", "ok-error", "WRONG", "CRASH", "HANG", "FOREIGN", "n/a")
NOT_OK = ("WRONG", "CRASH", "HANG", "FOREIGN")
ENTRY_POINTS = (
    "dataset:auto",
    "dataset:span",
    "dataset:whole",
    "getitems",
    "loader:0",
    "loader:2",
    "cli:index",
    "cli:inspect",
    "cli:inspect-strict",
    "cli:convert-memmap",
    "cli:convert-lmdb",
    "cli:convert-webdataset",
    "cli:split",
    "cli:verify",
)

Samples = list[tuple[int, Any]]  # (index in the dataset, sample), in the order returned


class _Hang(BaseException):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Hang


def _identity(batch: Any) -> Any:
    return batch


class _Run:
    """One run's folders and the oracle its samples are checked against."""

    def __init__(self, case_dir: Path, meta: dict[str, Any], run_dir: Path) -> None:
        self.meta, self.run_dir = meta, run_dir
        self.data = materialise(case_dir, meta, run_dir)
        self.path = self.data / DATA_NAME
        self.out = run_dir / "out"
        self.versions: list[list[Any]] = []
        if meta["expect"] == "data":
            self.versions.append(_oracle(self.data))
            if meta["setup"] == "rewrite":
                self.versions.append(_oracle_of(case_dir / REWRITE_NEW))
        self.rewrite: tuple[bytes, bytes] | None = None
        self.rewriter: Rewriter | None = None
        if meta["setup"] == "rewrite":
            self.rewrite = (self.path.read_bytes(), (case_dir / REWRITE_NEW).read_bytes())

    def begin(self) -> None:
        """Start rewriting the file, for a rewrite case (after the dataset is opened: a rewrite
        before it is only a stale index)."""
        if self.rewrite is not None and self.rewriter is None:
            self.rewriter = Rewriter(self.path, self.rewrite).__enter__()

    def end(self) -> None:
        if self.rewriter is not None:
            self.rewriter.__exit__()

    def names_file(self, message: str) -> bool:
        """Whether ``message`` names a file of the case: one in its data folder (the index
        too), where ``data.pkl`` points, or the CLI's output folder."""
        where = [f"{self.data}{os.sep}", os.path.realpath(self.path), os.fspath(self.out)]
        return any(w in message for w in where)

    def order(self, n: int) -> list[int]:
        """A shuffled epoch (seeded): the order the dataset entry points read samples in."""
        return [int(i) for i in np.random.default_rng(n).permutation(n)]

    def epochs(self) -> int:
        return REWRITE_EPOCHS if self.rewrite is not None else 1


def _oracle_of(path: Path) -> list[Any]:
    """Samples of one file by ``pickle.load`` (trusted: only ``expect="data"`` cases, made by
    the corpus from plain arrays and numbers), one call per appended pickle."""
    objs = []
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        while fh.tell() < size:
            objs.append(pickle.load(fh))
    return reference_samples(objs, os.fspath(path))[1]


def _oracle(data: Path) -> list[Any]:
    """Every sample of the pickle files of ``data`` in the dataset's order (sorted paths)."""
    out: list[Any] = []
    for name in sorted(os.listdir(data)):
        if name.endswith(".pkl"):
            out += _oracle_of(data / name)
    return out


# -- entry points: each returns the samples it read, or a CLI result -------------------------


def _dataset(run: _Run, mode: str) -> Samples:
    from ..dataset import PickleDataset

    ds = PickleDataset(run.data, mode=mode, jobs=1)  # type: ignore[arg-type]
    run.begin()
    got: Samples = []
    for _ in range(run.epochs()):
        got += [(i, ds[i]) for i in run.order(len(ds))]
    return got


def _getitems(run: _Run) -> Samples:
    from ..dataset import PickleDataset

    ds = PickleDataset(run.data, jobs=1)
    order = run.order(len(ds))
    run.begin()
    got: Samples = []
    for _ in range(run.epochs()):
        got += list(zip(order, ds.__getitems__(order), strict=True))
    return got


def _loader(run: _Run, workers: int) -> Samples:
    from torch.utils.data import DataLoader

    from ..dataset import PickleDataset

    ds = PickleDataset(run.data, jobs=1)
    order = run.order(len(ds))
    run.begin()
    got: Samples = []
    for _ in range(run.epochs()):
        loader = DataLoader(
            ds, batch_size=2, sampler=order, num_workers=workers, collate_fn=_identity
        )
        it = iter(loader)
        try:
            flat = [s for batch in it for s in batch]
        finally:
            # join the workers now: one still shutting down could print into the next run
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del it
        got += list(zip(order, flat, strict=False))
        if len(flat) != len(order):
            raise AssertionError(f"the DataLoader gave {len(flat)} samples of {len(order)}")
    return got


class CliResult:
    """A CLI run: exit code, stdout, stderr; the samples its output holds, read back, and
    (``split``, one file of the folder) the values they are checked against."""

    def __init__(self, rc: int, out: str, err: str) -> None:
        self.rc, self.out, self.err = rc, out, err
        self.samples: Samples = []
        self.versions: list[list[Any]] | None = None


def _cli(argv: Sequence[str]) -> CliResult:
    """``pickleshard ARGV`` in this process; an exception escaping it propagates (a traceback)."""
    from ..cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
    return CliResult(rc, out.getvalue(), err.getvalue())


def _read_converted(out: Path) -> Samples:
    from ..formats import open_dataset

    ds = open_dataset(out, shuffle=False)
    return [(i, ds[i]) for i in range(len(ds))]


def _read_split(run: _Run) -> Samples:
    from ..safety import DEFAULT_POLICY

    manifest = json.loads((run.out / "pickleshard-split.json").read_text())
    chunks = [c if isinstance(c, str) else c["name"] for c in manifest["chunks"]]
    samples: list[Any] = []
    for name in chunks:
        with open(run.out / name, "rb") as fh:
            obj = DEFAULT_POLICY.unpickler(fh, os.fspath(run.out / name)).load()
        samples += reference_samples([obj], name)[1]
    return list(enumerate(samples))


def _convert(run: _Run, fmt: str) -> CliResult:
    argv = ["convert", os.fspath(run.data), os.fspath(run.out), "--to", fmt]
    res = _cli([*argv, "--jobs", "1", "--json"])
    if res.rc == 0 and run.meta["expect"] == "data":
        res.samples = _read_converted(run.out)
    return res


def _split(run: _Run) -> CliResult:
    argv = ["split", os.fspath(run.path), os.fspath(run.out), "--max-samples", "2", "--json"]
    res = _cli(argv)
    if res.rc == 0 and run.meta["expect"] == "data":
        res.samples = _read_split(run)
        if run.rewrite is None:
            res.versions = [_oracle_of(run.path)]
    return res


def _verify(run: _Run) -> CliResult | None:
    """``verify DATA OUT`` after a ``convert`` to memmap; None when the conversion failed."""
    argv = ["convert", os.fspath(run.data), os.fspath(run.out), "--jobs", "1", "--json"]
    if _cli(argv).rc != 0:
        return None
    return _cli(["verify", os.fspath(run.data), os.fspath(run.out), "--json"])


_ENTRY: dict[str, Callable[[_Run], Samples | CliResult | None]] = {
    "dataset:auto": lambda r: _dataset(r, "auto"),
    "dataset:span": lambda r: _dataset(r, "span"),
    "dataset:whole": lambda r: _dataset(r, "whole"),
    "getitems": _getitems,
    "loader:0": lambda r: _loader(r, 0),
    "loader:2": lambda r: _loader(r, 2),
    "cli:index": lambda r: _cli(["index", os.fspath(r.data), "--jobs", "1", "--json"]),
    "cli:inspect": lambda r: _cli(["inspect", os.fspath(r.data), "--json"]),
    "cli:inspect-strict": lambda r: _cli(["inspect", os.fspath(r.data), "--json", "--strict"]),
    "cli:convert-memmap": lambda r: _convert(r, "memmap"),
    "cli:convert-lmdb": lambda r: _convert(r, "lmdb"),
    "cli:convert-webdataset": lambda r: _convert(r, "webdataset"),
    "cli:split": _split,
    "cli:verify": _verify,
}


# -- classification ---------------------------------------------------------------------------


def _check_samples(
    run: _Run, got: Samples, what: str, versions: list[list[Any]] | None = None
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


def _classify_cli(run: _Run, ep: str, res: CliResult) -> tuple[str, str]:
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


def _classify_exception(run: _Run, exc: BaseException) -> tuple[str, str]:
    from ..errors import PickleshardError

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
        run: _Run | None = None
        try:
            run = _Run(case_dir, meta, run_dir)
            if ep.startswith("cli:"):
                run.begin()
            try:
                got = _ENTRY[ep](run)
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
