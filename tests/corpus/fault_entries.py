"""The fault worker's entry points: one run's folders and oracle, and each way of reading them.

:class:`FaultRun` materialises a fault case into a fresh folder
(:func:`~corpus.fault_setup.materialise`) and holds what its samples are checked
against: :func:`pickle.load` of the files (both versions for a file rewritten during the epoch).
:data:`ENTRIES` maps each entry point of :mod:`corpus.fault_worker` to what it runs:
a dataset read (the samples it returned, by index) or a CLI command (a :class:`CliResult`, with
the samples its output holds read back). Classifying the outcome is the worker's.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pickleshard.cli import main as cli_main
from pickleshard.dataset import PickleDataset
from pickleshard.formats import open_dataset
from pickleshard.safety.policy import DEFAULT_POLICY
from pickleshard.testing.oracle import reference_samples

from .fault_setup import DATA_NAME, Rewriter, materialise
from .faults import REWRITE_NEW

__all__ = ["ENTRIES", "REWRITE_EPOCHS", "CliResult", "FaultRun", "Samples"]

REWRITE_EPOCHS = 12  # epochs a rewrite case reads while the file is rewritten under it
Samples = list[tuple[int, Any]]  # (index in the dataset, sample), in the order returned


def _identity(batch: Any) -> Any:
    return batch


class FaultRun:
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


def _dataset(run: FaultRun, mode: str) -> Samples:
    ds = PickleDataset(run.data, mode=mode, jobs=1)  # type: ignore[arg-type]
    run.begin()
    got: Samples = []
    for _ in range(run.epochs()):
        got += [(i, ds[i]) for i in run.order(len(ds))]
    return got


def _getitems(run: FaultRun) -> Samples:
    ds = PickleDataset(run.data, jobs=1)
    order = run.order(len(ds))
    run.begin()
    got: Samples = []
    for _ in range(run.epochs()):
        got += list(zip(order, ds.__getitems__(order), strict=True))
    return got


def _loader(run: FaultRun, workers: int) -> Samples:
    from torch.utils.data import DataLoader

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
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli_main(list(argv))
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
    return CliResult(rc, out.getvalue(), err.getvalue())


def _read_converted(out: Path) -> Samples:
    ds = open_dataset(out, shuffle=False)
    return [(i, ds[i]) for i in range(len(ds))]


def _read_split(run: FaultRun) -> Samples:
    manifest = json.loads((run.out / "pickleshard-split.json").read_text())
    chunks = [c if isinstance(c, str) else c["name"] for c in manifest["chunks"]]
    samples: list[Any] = []
    for name in chunks:
        with open(run.out / name, "rb") as fh:
            obj = DEFAULT_POLICY.unpickler(fh, os.fspath(run.out / name)).load()
        samples += reference_samples([obj], name)[1]
    return list(enumerate(samples))


def _convert(run: FaultRun, fmt: str) -> CliResult:
    argv = ["convert", os.fspath(run.data), os.fspath(run.out), "--to", fmt]
    res = _cli([*argv, "--jobs", "1", "--json"])
    if res.rc == 0 and run.meta["expect"] == "data":
        res.samples = _read_converted(run.out)
    return res


def _split(run: FaultRun) -> CliResult:
    argv = ["split", os.fspath(run.path), os.fspath(run.out), "--max-samples", "2", "--json"]
    res = _cli(argv)
    if res.rc == 0 and run.meta["expect"] == "data":
        res.samples = _read_split(run)
        if run.rewrite is None:
            res.versions = [_oracle_of(run.path)]
    return res


def _verify(run: FaultRun) -> CliResult | None:
    """``verify DATA OUT`` after a ``convert`` to memmap; None when the conversion failed."""
    argv = ["convert", os.fspath(run.data), os.fspath(run.out), "--jobs", "1", "--json"]
    if _cli(argv).rc != 0:
        return None
    return _cli(["verify", os.fspath(run.data), os.fspath(run.out), "--json"])


ENTRIES: dict[str, Callable[[FaultRun], Samples | CliResult | None]] = {
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
