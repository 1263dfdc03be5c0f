"""Run the bad-input corpus through every entry point, in subprocesses under resource limits.

:func:`run_corpus` writes each :class:`~corpus.corpus.Case` to its own folder, then
starts worker processes (:mod:`corpus.corpus_worker`, which says what each path
checks) that limit their own memory and CPU time, and gathers their per-case outcomes into a
:class:`CorpusReport`. A worker that dies on a case (crash, CPU limit, hang past the wall-clock
limit) makes that case a problem, and a fresh worker goes on with the cases after it.

``suite="faults"`` runs the fault corpus (:mod:`corpus.faults`) instead: one run per
(case, entry point of :data:`~corpus.fault_worker.ENTRY_POINTS`), each classified
by :mod:`corpus.fault_worker`; a worker that answers nothing for ``run_seconds`` is
killed and its run is a HANG, one that dies of another signal a CRASH.

From ``tests/`` (or with it on ``PYTHONPATH``), ``python -m corpus.corpus_run summary`` runs the
whole corpus and prints the counts; ``python -m corpus.corpus_run faults [--only TEXT]`` runs the
fault corpus and prints its outcome table (:func:`fault_table`). Either exits 1 when anything is
wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .corpus import Case, generate
from .corpus_worker import ORIGINAL
from .fault_worker import CLASSES, ENTRY_POINTS, META, NOT_OK, RUN_SECONDS
from .faults import fault_cases

__all__ = ["CorpusReport", "fault_table", "run_corpus"]

MEMORY_LIMIT = 2 << 30
# The workers run this package's corpus_worker module: the folder that holds the package (tests/)
# goes on their path, so they start the same from a clean clone as from an installed tree.
_PACKAGE = __package__ or "corpus"
_PACKAGE_HOME = Path(__file__).resolve().parents[_PACKAGE.count(".") + 1]
FAULT_MEMORY_LIMIT = 6 << 30  # the 1.5 GB amplifiers must really load, to show they are not refused


@dataclass
class CorpusReport:
    """What the corpus run found: per-case outcomes, counts, and every problem."""

    cases: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # of the workers, all together
    outcomes: dict[str, dict[str, str]] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)  # fault runs: what each one ended in
    seconds_by_case: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)  # fault runs that hung once, run again alone

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


def _write_cases(cases: Sequence[Case], root: Path, faults: bool) -> list[tuple[str, str]]:
    out = []
    for k, case in enumerate(cases):
        folder = root / f"{k:05d}"
        folder.mkdir(parents=True)
        (folder / f"f{case.suffix}").write_bytes(case.data)
        if case.original is not None:
            (folder / ORIGINAL).write_bytes(case.original)  # not a pickle name: never indexed
        if faults:
            for name, data in case.extra:
                (folder / name).write_bytes(data)
            meta = {
                "family": case.family,
                "expect": case.expect,
                "setup": case.setup,
                "suffix": case.suffix,
                "extra": [name for name, _ in case.extra],
            }
            (folder / META).write_text(json.dumps(meta))
        out.append((case.name, os.fspath(folder)))
    return out


@dataclass(frozen=True)
class _Setup:
    """What every worker of one corpus run shares."""

    work: Path
    canary: str
    memory: int
    cpu_seconds: int
    suite: str
    deadline: float  # perf_counter


def _run_worker(
    todo: list[tuple[str, str]], setup: _Setup, tag: str, run_seconds: float
) -> subprocess.Popen[bytes]:
    work = setup.work
    manifest = work / f"manifest-{tag}.json"
    spec = {
        "cases": todo,
        "index_dir": os.fspath(work / f"index-{tag}"),
        "canary": setup.canary,
        "suite": setup.suite,
        "work_dir": os.fspath(work / f"runs-{tag}"),
        "run_seconds": run_seconds,
    }
    manifest.write_text(json.dumps(spec))
    path = os.pathsep.join(p for p in (os.fspath(_PACKAGE_HOME), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": path}
    cmd = [
        sys.executable,
        "-m",
        f"{_PACKAGE}.corpus_worker",
        os.fspath(manifest),
        os.fspath(work / f"out-{tag}.jsonl"),
        str(setup.memory),
        str(setup.cpu_seconds),
    ]
    return subprocess.Popen(cmd, env=env, stderr=open(work / f"err-{tag}.txt", "ab"))


def run_corpus(
    cases: Sequence[Case],
    work: Path,
    canary: str,
    *,
    workers: int = 2,
    memory: int | None = None,
    cpu_seconds: int = 600,
    wall_seconds: float = 900,
    suite: str = "bad-input",
    entry_points: Sequence[str] = ENTRY_POINTS,
    run_seconds: float = RUN_SECONDS,
    confirm_seconds: float | None = None,
) -> CorpusReport:
    """Run ``cases`` in ``workers`` limited subprocesses (files written under ``work``).

    ``suite="faults"``: one run per case and entry point of ``entry_points``, each a HANG after
    ``run_seconds`` of wall clock; a worker silent for twice that plus 30 s is killed. A run that
    hangs is run again, alone, with ``confirm_seconds`` (four times ``run_seconds`` unless
    given), and only its second outcome counts: a HANG hangs twice, with nothing else running;
    a run that a busy machine slowed past the first limit finishes the second time
    (:attr:`CorpusReport.rerun` names those runs).
    """
    t0 = time.perf_counter()
    faults = suite == "faults"
    if memory is None:
        memory = FAULT_MEMORY_LIMIT if faults else MEMORY_LIMIT
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    written = _write_cases(cases, Path(work) / "cases", faults)
    report = CorpusReport(cases=len(cases))
    if faults:
        written = [(f"{name}::{ep}", folder) for name, folder in written for ep in entry_points]
    setup = _Setup(Path(work), canary, memory, cpu_seconds, suite, t0 + wall_seconds)
    _run_pass(setup, written, workers, run_seconds, "a", report)
    hung = [(n, f) for n, f in written if "HANG" in report.outcomes.get(n, {}).values()]
    if faults and hung:
        report.rerun = [n for n, _ in hung]
        _forget(report, report.rerun)
        _run_pass(setup, hung, 1, confirm_seconds or 4 * run_seconds, "b", report)
    if os.path.exists(canary):
        report.problems.append(f"the canary file {canary} exists")
    report.seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report.cpu_seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return report


def _run_pass(
    setup: _Setup,
    written: list[tuple[str, str]],
    workers: int,
    run_seconds: float,
    tag: str,
    report: CorpusReport,
) -> None:
    """Run ``written`` (name, folder) in ``workers`` worker queues, a fresh worker after each
    death, recording into ``report``; what the deadline cuts is a problem, "not run"."""
    faults = setup.suite == "faults"
    idle = 2 * run_seconds + 30 if faults else None
    queues = [written[k::workers] for k in range(workers)]
    runs = 0
    while any(queues):
        procs = []
        for k, todo in enumerate(queues):
            if todo:
                runs += 1
                name = f"{tag}{k}-{runs}"
                procs.append((k, name, _run_worker(todo, setup, name, run_seconds)))
        for k, name, proc in procs:
            out = setup.work / f"out-{name}.jsonl"
            rc, hung = _wait(proc, out, setup.deadline, idle)
            err = setup.work / f"err-{name}.txt"
            queues[k] = _collect(queues[k], out, rc, report, err, hung, faults)
        if time.perf_counter() > setup.deadline:
            for todo in queues:
                report.problems += [
                    f"{name}: not run (corpus wall-clock limit)" for name, _ in todo
                ]
            break


def _forget(report: CorpusReport, names: Sequence[str]) -> None:
    """Drop what ``report`` holds on the runs ``names`` (before they are run again)."""
    for name in names:
        report.outcomes.pop(name, None)
        report.details.pop(name, None)
        report.seconds_by_case.pop(name, None)
    prefixes = tuple(f"{name}: " for name in names)
    report.problems = [p for p in report.problems if not p.startswith(prefixes)]


def _wait(
    proc: subprocess.Popen[bytes], out: Path, deadline: float, idle: float | None
) -> tuple[int, bool]:
    """Wait for ``proc`` until ``deadline`` (``perf_counter``); with ``idle``, kill it when
    ``out`` has not grown for that long. Return its exit code and whether it was killed idle."""
    size, since = -1, time.perf_counter()
    while True:
        now = time.perf_counter()
        try:
            return proc.wait(timeout=0.25 if idle else max(1.0, deadline - now)), False
        except subprocess.TimeoutExpired:
            pass
        grown = out.stat().st_size if out.exists() else 0
        if grown != size:
            size, since = grown, now
        if now > deadline or (idle is not None and now - since > idle):
            proc.kill()
            return proc.wait(), bool(idle is not None and now - since > idle)


def _death(rc: int, hung: bool) -> str:
    """The fault class of a worker's death on a run: killed silent or at its CPU limit is a
    hang, any other death a crash."""
    if hung or rc in (-signal.SIGXCPU, -signal.SIGKILL):
        return "HANG"
    return "CRASH"


def _collect(
    todo: list[tuple[str, str]],
    out: Path,
    rc: int,
    report: CorpusReport,
    err: Path,
    hung: bool = False,
    faults: bool = False,
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
        if "detail" in rec:
            report.details[rec["case"]] = rec["detail"]
        report.problems += [f"{rec['case']}: {p}" for p in rec["problems"]]
    tail = err.read_text(errors="replace")[-600:] if err.exists() else ""
    left = [n for n, _ in todo if n not in done]
    if started is None and not left:
        if rc != 0:
            report.problems.append(f"a worker exited with {rc} after its last case: {tail}")
        return []
    culprit = started or left[0]
    how = "was killed after no answer" if hung else f"died (exit {rc})"
    if faults:
        ep = culprit.split("::")[-1]
        text = err.read_text(errors="replace") if err.exists() else ""
        fatal = [ln for ln in text.splitlines() if ln.startswith("Fatal Python error")][-1:]
        report.outcomes[culprit] = {ep: _death(rc, hung)}
        report.problems.append(f"{culprit}: {_death(rc, hung)}: the worker {how}: {fatal}")
    else:
        report.outcomes[culprit] = {"worker": f"died rc={rc}"}
        report.problems.append(f"{culprit}: the worker {how} on this case: {tail}")
    done.add(culprit)
    return [(n, f) for n, f in todo if n not in done]


def fault_counts(report: CorpusReport) -> Counter[str]:
    """Runs per class (:data:`~corpus.fault_worker.CLASSES`) of a fault run."""
    return Counter(c for per_run in report.outcomes.values() for c in per_run.values())


def fault_table(report: CorpusReport, *, verbose: bool = False) -> str:
    """The fault corpus' outcome table: cases, runs, runs per class overall and per entry point,
    the cases with a run that is not ok (WRONG, CRASH, HANG, FOREIGN) and each such run with
    what happened; ``verbose`` adds every run (the messages of the ok-errors, to judge)."""
    cases = {name.split("::")[0] for name in report.outcomes}
    counts = fault_counts(report)
    lines = [
        f"fault corpus: {len(cases)} cases, {sum(counts.values())} entry-point runs in "
        f"{report.seconds:.1f} s ({report.cpu_seconds:.1f} CPU seconds in the workers)",
        "  " + ", ".join(f"{c} {counts[c]}" for c in CLASSES),
    ]
    by_ep: dict[str, Counter[str]] = {}
    for per_run in report.outcomes.values():
        for ep, c in per_run.items():
            by_ep.setdefault(ep, Counter())[c] += 1
    width = max(len(ep) for ep in by_ep) if by_ep else 0
    lines.append(f"  {'entry point':<{width}}  " + " ".join(f"{c:>10}" for c in CLASSES))
    for ep in [e for e in ENTRY_POINTS if e in by_ep]:
        lines.append(f"  {ep:<{width}}  " + " ".join(f"{by_ep[ep][c]:>10}" for c in CLASSES))
    bad = [p for p in report.problems if any(f": {c}: " in p for c in NOT_OK)]
    other = [p for p in report.problems if p not in bad]
    by_case: dict[str, Counter[str]] = {}
    for name, per_run in report.outcomes.items():
        by_case.setdefault(name.split("::")[0], Counter()).update(per_run.values())
    lines.append(
        "  cases with a run not ok: "
        + ", ".join(
            f"{case} ({sum(c[k] for k in NOT_OK)})"
            for case, c in sorted(by_case.items())
            if any(c[k] for k in NOT_OK)
        )
    )
    if report.rerun:
        lines.append(
            f"  hung once, then run again alone: {len(report.rerun)} ({', '.join(report.rerun)})"
        )
    lines.append(f"  not ok: {len(bad)}")
    lines += [f"    {p[:600]}" for p in sorted(bad)]
    lines += [f"  other problem: {p}" for p in other]
    if verbose:
        lines.append("  every run:")
        for name, per_run in sorted(report.outcomes.items()):
            for c in per_run.values():
                lines.append(f"    {name}: {c}: {report.details.get(name, '')[:300]}")
    return "\n".join(lines)


def _summary_main(argv: Sequence[str]) -> int:
    """``python -m corpus.corpus_run summary``: run the whole corpus in a temporary
    folder, print the outcome counts and every problem; exit 1 if there is any.
    ``... faults [--only TEXT]``: the fault corpus (the cases whose name holds TEXT), its table."""
    p = argparse.ArgumentParser(prog="python -m corpus.corpus_run")
    p.add_argument("suite", nargs="?", choices=("summary", "faults"), default="summary")
    p.add_argument("--only", default="", help="fault cases whose name contains this text")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--hang-seconds", type=float, default=RUN_SECONDS, help="wall clock per run")
    p.add_argument("--verbose", action="store_true", help="list every run and its message")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pickleshard-corpus-") as tmp:
        canary = os.path.join(tmp, "canary")
        if args.suite == "faults":
            cases = [c for c in fault_cases(canary) if args.only in c.name]
            report = run_corpus(
                cases,
                Path(tmp),
                canary,
                suite="faults",
                workers=args.workers,
                wall_seconds=3600,
                cpu_seconds=3600,
                run_seconds=args.hang_seconds,
            )
            print(fault_table(report, verbose=args.verbose))
            return 1 if report.problems else 0
        report = run_corpus(generate(canary), Path(tmp), canary)
    print(report.summary())
    print("\n".join(report.problems))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(_summary_main(sys.argv[1:]))
