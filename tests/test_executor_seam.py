"""The one executor seam of index, convert and verify, without a cluster.

What an executor is named by (``resolve_executor``), that convert and verify give the same
result through any executor (results in the worst order, tasks run twice), that a part's
temporary folder is its own (a second run of the same part never deletes another's), and the
install hint when ``distributed`` is missing.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from pickleshard.errors import MissingDependencyError, VerifyMismatchError
from pickleshard.executors import (
    InlineExecutor,
    ProcessPoolIndexExecutor,
    dask_address,
    resolve_executor,
)
from pickleshard.executors.dask import DaskExecutor
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.pipelines.verify.run import verify
from pickleshard.testing import write_files

R = TypeVar("R")


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes)."""
    return {
        os.fspath(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


class ReversedExecutor:
    """Every call here (each task pickled first, as a remote executor sends it), results last
    first: the worst order for a caller that must put them back in place."""

    def run(
        self, work: Callable[..., R], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, R], None, None]:
        results = [(k, work(*pickle.loads(pickle.dumps(args)))) for k, args in enumerate(tasks)]
        yield from reversed(results)


class TwiceExecutor:
    """Every call runs twice (a Dask task rescheduled after its first run was presumed lost);
    before each, another run's temporary folder of the same part is planted under the name the
    pid-based scheme gave it, and recorded if it did not survive."""

    def __init__(self) -> None:
        self.lost: list[Path] = []

    def run(
        self, work: Callable[..., R], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, R], None, None]:
        for k, args in enumerate(tasks):
            job, spec = args
            other = job.staging / "parts" / f"part-{spec.id:05d}.tmp-{os.getpid()}"
            other.mkdir(parents=True, exist_ok=True)
            (other / "being-written").write_bytes(b"x")
            work(*args)
            got = work(*args)
            if not (other / "being-written").exists():
                self.lost.append(other)
            yield k, got


def test_executor_names_resolve() -> None:
    assert isinstance(resolve_executor(None, 1, 5), InlineExecutor)
    assert isinstance(resolve_executor("local", 3, 5), ProcessPoolIndexExecutor)
    dask = resolve_executor("dask", 3, 5)
    assert isinstance(dask, DaskExecutor)
    assert (dask.address, dask.workers) == (None, 3)
    remote = resolve_executor("dask://10.0.0.5:8786", 3, 5)
    assert isinstance(remote, DaskExecutor)
    assert remote.address == "tcp://10.0.0.5:8786"
    mine = ReversedExecutor()
    assert resolve_executor(mine, 2, 2) is mine
    assert dask_address("dask=10.0.0.5:8786") == "tcp://10.0.0.5:8786"
    assert dask_address("dask=tls://h:1") == "tls://h:1"
    assert dask_address("dask") is None
    for bad in ("dusk", "dask=", "dask://", "spark"):
        with pytest.raises(ValueError, match="executor"):
            resolve_executor(bad, 1, 1)
    with pytest.raises(TypeError, match="executor must be"):
        resolve_executor(42, 1, 1)


def test_a_missing_distributed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'pickleshard\[dask\]'"):
        list(DaskExecutor().run(abs, [(1,)]))


@pytest.mark.parametrize("to", ["memmap", "webdataset"])
def test_convert_through_any_executor_is_byte_identical(tmp_path: Path, to: str) -> None:
    write_synthetic(tmp_path / "data", files=6, per_file=5, shape=(3,))
    convert(tmp_path / "data", tmp_path / "local", to=to, jobs=1)
    convert(tmp_path / "data", tmp_path / "reversed", to=to, executor=ReversedExecutor())
    assert _tree(tmp_path / "reversed") == _tree(tmp_path / "local")


def test_a_part_run_twice_keeps_one_complete_part_and_spares_other_runs(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "data", files=4, per_file=5, shape=(3,))
    convert(tmp_path / "data", tmp_path / "local", jobs=1)
    twice = TwiceExecutor()
    convert(tmp_path / "data", tmp_path / "twice", executor=twice)
    assert twice.lost == []  # no run deleted a folder another run of its part was writing
    assert _tree(tmp_path / "twice") == _tree(tmp_path / "local")
    assert not (tmp_path / ".twice.partial").exists()


def _mismatched(tmp_path: Path) -> tuple[Path, Path]:
    n = 700  # three runs of verify: 256, 256, 188 samples
    xs = [np.full((2,), k, dtype=np.int32) for k in range(n)]
    write_files(tmp_path / "src", [(xs, list(range(n)))])
    convert(tmp_path / "src", tmp_path / "out", jobs=1)
    changed = list(range(n))
    changed[300] = changed[650] = -1  # in the second and the third run
    write_files(tmp_path / "changed", [(xs, changed)])
    return tmp_path / "changed", tmp_path / "out"


def test_verify_names_the_first_mismatch_whatever_order_runs_finish(tmp_path: Path) -> None:
    changed, out = _mismatched(tmp_path)
    with pytest.raises(VerifyMismatchError) as inline:
        verify(changed, out)
    with pytest.raises(VerifyMismatchError) as reversed_:
        verify(changed, out, executor=ReversedExecutor())
    assert inline.value.sample == reversed_.value.sample == 300
    assert str(reversed_.value) == str(inline.value)


def test_verify_reports_the_same_through_a_process_pool(tmp_path: Path) -> None:
    changed, out = _mismatched(tmp_path)
    src = tmp_path / "src"
    want = verify(src, out)
    got = verify(src, out, jobs=2)
    assert (got.out, got.checked, got.total, got.against) == (
        want.out,
        want.checked,
        want.total,
        want.against,
    )
    sampled = verify(None, out, sample=300, seed=3, executor=ReversedExecutor())
    assert (sampled.checked, sampled.against) == (300, "stored hashes")
    with pytest.raises(VerifyMismatchError) as pooled:
        verify(changed, out, jobs=2)
    assert pooled.value.sample == 300


class ElsewhereExecutor:
    """Every call in another working directory, as on a cluster's worker."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def run(
        self, work: Callable[..., R], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, R], None, None]:
        here = os.getcwd()
        for k, args in enumerate(tasks):
            os.chdir(self.cwd)
            try:
                got = work(*args)
            finally:
                os.chdir(here)
            yield k, got


def test_relative_paths_reach_workers_whose_cwd_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (elsewhere := tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    write_synthetic(Path("data"), files=3, per_file=4, shape=(2,))
    away = ElsewhereExecutor(elsewhere)
    from pickleshard.indexing.build import build_index

    index = build_index("data", index="idx", executor=away)
    assert index.num_samples == 12
    convert("data", "out", executor=away)
    convert("data", "ref", jobs=1)
    assert _tree(tmp_path / "out") == _tree(tmp_path / "ref")
    assert verify("data", "out", executor=away).checked == 12
    assert verify(None, "out", executor=away).against == "stored hashes"
    assert list(elsewhere.iterdir()) == []  # nothing was written relative to the workers' cwd
