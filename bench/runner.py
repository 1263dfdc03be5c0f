"""One row of the benchmark: build one dataset, run one epoch, in a process of its own.

:func:`run_isolated` starts ``python -m bench.runner`` for each row, so no row inherits another's
heap (a freed 500 MB list stays in the allocator's arenas) or page-table state; inside it,
:func:`run_row` does the work and the result comes back as JSON.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["RowResult", "RowSpec", "run_isolated", "run_row"]

Kind = Literal["null", "naive", "folk", "pickleshard", "span"]
Order = Literal["sequential", "shuffled"]


@dataclass(frozen=True)
class RowSpec:
    """Everything one row needs; plain values so it travels as JSON."""

    kind: Kind
    order: Order
    workers: int
    data_root: str
    files: int
    per_file: int
    shape: tuple[int, ...]
    batch_size: int
    cache_bytes: int
    folk_shuffle_cap: int
    seed: int = 0
    memory_interval: float = 0.05
    gc_freeze: bool = False

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RowSpec:
        return cls(**{**obj, "shape": tuple(obj["shape"])})


@dataclass(frozen=True)
class RowResult:
    """Raw numbers of one row (bytes and seconds; ``index_s`` None where nothing is indexed)."""

    spec: RowSpec
    index_s: float | None
    index_loads: int
    idle_pss: int
    idle_alone: int
    samples: int
    seconds: float
    samples_per_s: float
    start_pss: int
    peak_pss: int
    start_alone: int
    peak_alone: int
    memory_samples: int
    file_loads: int
    capped: bool

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RowResult:
        return cls(**{**obj, "spec": RowSpec.from_json(obj["spec"])})


def _prepare(spec: RowSpec) -> tuple[Any, Iterable[int], float | None, int, bool]:
    """Build the row's dataset and sampler: ``(dataset, sampler, index_s, index_loads, capped)``."""
    import torch
    from torch.utils.data import RandomSampler, SequentialSampler

    from pickleshard import BlockShuffleSampler, PickleDataset, build_index

    from .baselines import FolkJsonDataset, NaiveListDataset, NullDataset, write_folk_index
    from .counting import file_loads
    from .data import DataSpec
    from .measure import Stopwatch

    data = DataSpec(Path(spec.data_root), spec.files, spec.per_file, spec.shape, spec.seed)
    shuffled = spec.order == "shuffled"
    index_s: float | None = None
    loads = 0
    dataset: Any
    sampler: Iterable[int]
    if spec.kind == "span":
        # The span index: the scanner reads opcodes only, no file is unpickled.
        shutil.rmtree(data.directory / ".pickleshard", ignore_errors=True)
        with Stopwatch() as clock:
            build_index(data.directory)
        index_s = clock.seconds
        dataset = PickleDataset(data.directory, mode="span", rebuild="never")
        if not shuffled:
            return dataset, SequentialSampler(dataset), index_s, 0, False
        generator = torch.Generator().manual_seed(spec.seed)
        return dataset, RandomSampler(dataset, generator=generator), index_s, 0, False
    if spec.kind == "pickleshard":
        shutil.rmtree(data.directory / ".pickleshard", ignore_errors=True)
        with Stopwatch() as clock:
            build_index(data.directory, spans=False)
        index_s, loads = clock.seconds, spec.files  # spans=False unpickles every file once
        dataset = PickleDataset(
            data.directory, mode="whole", cache_bytes=spec.cache_bytes, rebuild="never"
        )
        sampler = BlockShuffleSampler(
            dataset,
            batch_size=spec.batch_size,
            num_workers=spec.workers,
            cache_bytes=spec.cache_bytes,
            shuffle=shuffled,
            seed=spec.seed,
        )
        return dataset, sampler, index_s, loads, False
    if spec.kind == "null":
        dataset = NullDataset(data.num_samples, spec.shape)
    elif spec.kind == "naive":
        with Stopwatch() as clock:
            dataset = NaiveListDataset(data.paths)
        index_s, loads = clock.seconds, file_loads(dataset)
    else:
        with Stopwatch() as clock:
            loads = write_folk_index(data.paths, data.folk_index)
            dataset = FolkJsonDataset(data.folk_index)
        index_s = clock.seconds
    if not shuffled:
        return dataset, SequentialSampler(dataset), index_s, loads, False
    cap = spec.folk_shuffle_cap if spec.kind == "folk" else len(dataset)
    cap = min(cap, len(dataset))
    # What DataLoader(shuffle=True) builds, cut to the first ``cap`` indices of its permutation.
    generator = torch.Generator().manual_seed(spec.seed)
    sampler = RandomSampler(dataset, num_samples=cap, generator=generator)
    return dataset, sampler, index_s, loads, cap < len(dataset)


def run_row(spec: RowSpec) -> RowResult:
    """Measure one row in this process (its DataLoader workers become its children)."""
    import torch  # noqa: F401 - imported before the idle measurement, as every row does

    from .counting import FileLoadCounter, LoadCountingDataset
    from .epoch import run_epoch
    from .measure import tree_memory

    gc.collect()
    idle = tree_memory()
    dataset, sampler, index_s, index_loads, capped = _prepare(spec)
    counter = FileLoadCounter(spec.workers)
    wrapped = LoadCountingDataset(dataset, counter)
    gc.collect()
    if spec.gc_freeze:
        # Moves every object alive now out of the collector's reach, so a worker's full
        # collection no longer writes to (and so copies) the pages it shares with this process.
        gc.freeze()
    epoch = run_epoch(
        wrapped,
        sampler,
        batch_size=spec.batch_size,
        workers=spec.workers,
        memory_interval=spec.memory_interval,
    )
    return RowResult(
        spec=spec,
        index_s=index_s,
        index_loads=index_loads,
        idle_pss=idle.pss,
        idle_alone=idle.alone,
        samples=epoch.samples,
        seconds=epoch.seconds,
        samples_per_s=epoch.samples_per_s,
        start_pss=epoch.start_pss,
        peak_pss=epoch.peak_pss,
        start_alone=epoch.start_alone,
        peak_alone=epoch.peak_alone,
        memory_samples=epoch.memory_samples,
        file_loads=counter.total(),
        capped=capped,
    )


def run_isolated(spec: RowSpec, *, timeout: float | None = None) -> RowResult:
    """Run :func:`run_row` in a fresh ``python -m bench.runner`` process and return its result."""
    repo_root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="bench-row-") as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run(
            [sys.executable, "-m", "bench.runner", str(out)],
            input=json.dumps(asdict(spec)),
            text=True,
            env=env,
            check=True,
            timeout=timeout,
        )
        return RowResult.from_json(json.loads(out.read_text()))


def _child_main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.runner RESULT_JSON < ROW_SPEC_JSON", file=sys.stderr)
        return 2
    spec = RowSpec.from_json(json.loads(sys.stdin.read()))
    result = run_row(spec)
    Path(argv[0]).write_text(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
