"""Run the bad-input corpus through every entry point, in subprocesses under resource limits.

:func:`run_corpus` writes each :class:`~pickleshard.testing.corpus.Case` to its own folder, then
starts worker processes (:mod:`pickleshard.testing.corpus_worker`, which says what each path
checks) that limit their own memory and CPU time, and gathers their per-case outcomes into a
:class:`CorpusReport`. A worker that dies on a case (crash, CPU limit, hang past the wall-clock
limit) makes that case a problem, and a fresh worker goes on with the cases after it.

``python -m pickleshard.testing.corpus_run summary`` runs the whole corpus and prints the counts.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .corpus import Case
from .corpus_worker import ORIGINAL

__all__ = ["CorpusReport", "run_corpus"]

MEMORY_LIMIT = 2 << 30


@dataclass
class CorpusReport:
    """What the corpus run found: per-case outcomes, counts, and every problem."""

    cases: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # of the workers, all together
    outcomes: dict[str, dict[str, str]] = field(default_factory=dict)
    seconds_by_case: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, Counter[str]]:
        """``{path: Counter(outcome class name)}``."""
        out: dict[str, Counter[str]] = {}
        for per_case in self.outcomes.values():
            for path, outcome in per_case.items():
                out.setdefault(path, Counter())[outcome] += 1
        return out

    def summary(self) -> str:
        lines = [
            f"bad-input corpus: {self.cases} cases in {self.seconds:.1f} s "
            f"({self.cpu_seconds:.1f} CPU seconds in the workers)"
        ]
        for path, counter in sorted(self.counts().items()):
            shown = ", ".join(f"{k} {v}" for k, v in counter.most_common())
            lines.append(f"  {path}: {shown}")
        slow = sorted(self.seconds_by_case.items(), key=lambda kv: -kv[1])[:5]
        lines.append("  slowest: " + ", ".join(f"{n} {s:.2f} s" for n, s in slow))
        lines.append(f"  problems: {len(self.problems)}")
        return "\n".join(lines)


def _write_cases(cases: Sequence[Case], root: Path) -> list[tuple[str, str]]:
    out = []
    for k, case in enumerate(cases):
        folder = root / f"{k:05d}"
        folder.mkdir(parents=True)
        (folder / f"f{case.suffix}").write_bytes(case.data)
        if case.original is not None:
            (folder / ORIGINAL).write_bytes(case.original)  # not a pickle name: never indexed
        out.append((case.name, os.fspath(folder)))
    return out


def _run_worker(
    todo: list[tuple[str, str]], work: Path, canary: str, memory: int, cpu: int, tag: str
) -> subprocess.Popen[bytes]:
    manifest = work / f"manifest-{tag}.json"
    spec = {"cases": todo, "index_dir": os.fspath(work / f"index-{tag}"), "canary": canary}
    manifest.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pickleshard.testing.corpus_worker",
        os.fspath(manifest),
        os.fspath(work / f"out-{tag}.jsonl"),
    ]
    cmd += [str(memory), str(cpu)]
    return subprocess.Popen(cmd, env=env, stderr=open(work / f"err-{tag}.txt", "ab"))


def run_corpus(
    cases: Sequence[Case],
    work: Path,
    canary: str,
    *,
    workers: int = 2,
    memory: int = MEMORY_LIMIT,
    cpu_seconds: int = 600,
    wall_seconds: float = 900,
) -> CorpusReport:
    """Run ``cases`` in ``workers`` limited subprocesses (files written under ``work``)."""
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    written = _write_cases(cases, Path(work) / "cases")
    report = CorpusReport(cases=len(cases))
    queues = [written[k::workers] for k in range(workers)]
    runs = 0
    while any(queues):
        procs = []
        for k, todo in enumerate(queues):
            if todo:
                runs += 1
                procs.append(
                    (
                        k,
                        f"{k}-{runs}",
                        _run_worker(todo, work, canary, memory, cpu_seconds, f"{k}-{runs}"),
                    )
                )
        for k, tag, proc in procs:
            try:
                rc = proc.wait(timeout=max(1.0, wall_seconds - (time.perf_counter() - t0)))
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            queues[k] = _collect(
                queues[k], work / f"out-{tag}.jsonl", rc, report, work / f"err-{tag}.txt"
            )
        if time.perf_counter() - t0 > wall_seconds:
            for todo in queues:
                report.problems += [
                    f"{name}: not run (corpus wall-clock limit)" for name, _ in todo
                ]
            break
    if os.path.exists(canary):
        report.problems.append(f"the canary file {canary} exists")
    report.seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report.cpu_seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return report


def _collect(
    todo: list[tuple[str, str]], out: Path, rc: int, report: CorpusReport, err: Path
) -> list[tuple[str, str]]:
    """Record the worker's results; return the cases it did not get to (after a crash)."""
    started: str | None = None
    done = set()
    text = out.read_text() if out.exists() else ""
    for line in text.splitlines():
        rec = json.loads(line)
        if "start" in rec:
            started = rec["start"]
            continue
        started = None
        done.add(rec["case"])
        report.outcomes[rec["case"]] = rec["outcomes"]
        report.seconds_by_case[rec["case"]] = rec["seconds"]
        report.problems += [f"{rec['case']}: {p}" for p in rec["problems"]]
    tail = err.read_text(errors="replace")[-600:] if err.exists() else ""
    left = [n for n, _ in todo if n not in done]
    if started is None and not left:
        if rc != 0:
            report.problems.append(f"a worker exited with {rc} after its last case: {tail}")
        return []
    culprit = started or left[0]
    report.outcomes[culprit] = {"worker": f"died rc={rc}"}
    report.problems.append(f"{culprit}: the worker died (exit {rc}) on this case: {tail}")
    done.add(culprit)
    return [(n, f) for n, f in todo if n not in done]


def _summary_main() -> int:
    """``python -m pickleshard.testing.corpus_run summary``: run the whole corpus in a temporary
    folder, print the outcome counts and every problem; exit 1 if there is any."""
    import tempfile

    from .corpus import generate

    with tempfile.TemporaryDirectory(prefix="pickleshard-corpus-") as tmp:
        canary = os.path.join(tmp, "canary")
        report = run_corpus(generate(canary), Path(tmp), canary)
    print(report.summary())
    print("\n".join(report.problems))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(_summary_main())
