"""Run the bad-input corpus through every entry point, in subprocesses under resource limits.

:func:`run_corpus` writes each :class:`~pickleshard.testing.corpus.Case` to its own folder, then
starts worker processes (``python -m pickleshard.testing.corpus_run``) that set ``RLIMIT_AS``
and ``RLIMIT_CPU`` on themselves and, per case, try:

``load``
    :func:`pickleshard.wholefile.load_file`.
``scan:<engine>``
    :func:`pickleshard.scan.scan_file` with each available engine, then
    :meth:`~pickleshard.spanread.SpanReader.read_sample` of every sample (span rewrite of the
    same engine, globals restricted to the allowlist).
``stale:<engine>``
    truncated and bit-flipped cases only: the spans of the valid original, read from the
    damaged bytes, as after a file changed since it was indexed (no value is checked).
``scan:general``
    the python scan read by the pure-Python general span path (the fast path's oracle), for
    files up to 64 KiB.
``index``
    :func:`pickleshard.build_index` over the case's folder (spans, or whole when refused).
``dataset``
    every sample of :class:`~pickleshard.PickleDataset` over that index, when it was built.

The reference is ``pickle.load`` under the same allowlist, one call per appended pickle. A path
*passes* when it returns a result equal to the reference, or raises a
:class:`~pickleshard.errors.PickleshardError` whose message names the file. Anything else is a
*problem*: another exception, a message without the file name, a value that differs, a result
where the reference failed, the canary file existing, or the worker dying (crash, timeout,
memory) on the case; a dead worker is replaced and goes on after that case.

``python -m pickleshard.testing.corpus_run summary`` runs the whole corpus and prints the counts.

Each worker writes one JSON line per case, ``{"case", "outcomes": {path: class name or "ok"},
"problems": [...]}``, preceded by a ``{"start": case}`` line so a case that kills it is named.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from .corpus import Case

__all__ = ["CorpusReport", "deep_diff", "run_corpus"]

MEMORY_LIMIT = 2 << 30
_ORIGINAL = "original.bin"
CASE_SECONDS = 20
GENERAL_MAX_BYTES = 64 << 10  # the pure-Python span path is slow on the 100k-deep files


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


def deep_diff(got: Any, want: Any) -> str | None:
    """How ``got`` differs from ``want`` (types, values, array bits), or None; iterative, so
    100,000 nested lists compare without recursion (the report gives the nesting depth)."""
    collecting = gc.isenabled()
    gc.disable()  # the walk makes no cycles; GC passes over deep values would dominate it
    try:
        return _deep_diff(got, want)
    finally:
        if collecting:
            gc.enable()


def _deep_diff(got: Any, want: Any) -> str | None:
    todo: list[tuple[Any, Any, int]] = [(got, want, 0)]
    while todo:
        g, w, depth = todo.pop()
        tw = type(w)
        if type(g) is not tw:
            return f"depth {depth}: {type(g).__name__} != {tw.__name__}"
        if tw is list or tw is tuple:
            if len(g) != len(w):
                return f"depth {depth}: length {len(g)} != {len(w)}"
            todo.extend(zip(g, w, repeat(depth + 1)))
        elif isinstance(w, np.ndarray):
            if (g.dtype, g.shape) != (w.dtype, w.shape):
                return f"depth {depth}: array {g.dtype}{g.shape} != {w.dtype}{w.shape}"
            if w.dtype.hasobject:
                todo.extend(zip(g.flat, w.flat, repeat(depth + 1)))
            elif g.tobytes() != w.tobytes():
                return f"depth {depth}: array bytes differ"
        elif isinstance(w, (list, tuple)):
            if len(g) != len(w):
                return f"depth {depth}: length {len(g)} != {len(w)}"
            todo.extend(zip(g, w, repeat(depth + 1)))
        elif isinstance(w, dict):
            keys_g, keys_w = list(g), list(w)
            if [type(k) for k in keys_g] != [type(k) for k in keys_w] or keys_g != keys_w:
                return f"depth {depth}: dict keys differ"
            todo.extend((g[k], w[k], depth + 1) for k in keys_w)
        elif isinstance(w, float) and math.isnan(w):
            if not math.isnan(g):
                return f"depth {depth}: {g!r} != nan"
        elif isinstance(w, np.generic):
            if g.tobytes() != w.tobytes():
                return f"depth {depth}: {g!r} != {w!r}"
        elif g != w:
            return f"depth {depth}: {g!r} != {w!r}"
    return None


# -- the worker -------------------------------------------------------------------------------


class _CaseTimeout(BaseException):
    pass


class _NotRun(Exception):
    """The path does not apply to this case (no index to read)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _CaseTimeout


def _engines() -> list[str]:
    """The scanner engines to try: the pure-Python walker, and the compiled one when built."""
    from .. import opcodes

    return ["python"] + (["compiled"] if opcodes.compiled_walker() is not None else [])


def _reference(path: str) -> tuple[list[Any] | None, str]:
    """Every pickle of ``path`` loaded one after another under the default allowlist."""
    from ..safety import DEFAULT_POLICY

    objs = []
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            while True:
                objs.append(DEFAULT_POLICY.unpickler(fh, path).load())
                if fh.tell() >= size:
                    return objs, ""
    except BaseException as exc:
        if isinstance(exc, _CaseTimeout):
            raise
        return None, type(exc).__name__


def _reference_samples(objs: list[Any], path: str) -> tuple[tuple[str, ...], list[Any]]:
    """Fields and samples of ``objs`` by the scanner's rules for appended pickles."""
    from ..errors import UnsupportedLayoutError
    from ..layouts import decode_layout, default_field_names

    try:
        decoded = [decode_layout(o, path) for o in objs]
    except UnsupportedLayoutError:
        if len(objs) == 1:
            raise
        first = objs[0]
        if type(first) is tuple and first:
            return default_field_names(len(first)), [tuple(o) for o in objs]
        if type(first) is dict and first:
            keys = list(first)
            return tuple(str(k) for k in keys), [tuple(o[k] for k in keys) for o in objs]
        return ("x",), [(o,) for o in objs]
    return decoded[0].fields, [s for d in decoded for s in zip(*d.columns, strict=True)]


class _Worker:
    def __init__(self, index_dir: str, canary: str) -> None:
        self.index_dir, self.canary = index_dir, canary
        self.engines = _engines()
        self._originals: dict[tuple[str, bytes], Any] = {}
        self.built = False

    def run(self, name: str, folder: str, out: Any) -> None:
        from ..errors import PickleshardError

        files = sorted(os.listdir(folder))
        path = os.path.join(folder, next(f for f in files if f != _ORIGINAL))
        original = os.path.join(folder, _ORIGINAL) if _ORIGINAL in files else None
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
        from ..wholefile import load_records

        got = load_records(path)
        if ref is None:
            return "load_records succeeds, but pickle.load fails"
        diff = deep_diff(got, ref)
        return f"value differs from pickle.load at {diff}" if diff else None

    def _scan(self, path: str, ref: list[Any] | None, ref_error: str, engine: str) -> str | None:
        """``engine`` "general": the python scan read by the pure-Python general span path."""
        from ..scan import scan_file
        from ..spanread import SpanReader

        general = engine == "general"
        engine = "python" if general else engine
        scan = scan_file(path, engine=engine)
        want: list[Any] | None = None
        if ref is not None:
            fields, want = _reference_samples(ref, path)
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
        from ..scan import scan_file
        from ..spanread import SpanReader

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
        from ..index import build_index

        self.built = False
        build_index(folder, index=self.index_dir, jobs=1)
        self.built = True  # without unpickling in span mode: a bad payload shows when read
        return None

    def _dataset(self, folder: str, path: str, ref: list[Any] | None, ref_error: str) -> str | None:
        """Every sample through :class:`~pickleshard.PickleDataset` over the index just built."""
        from ..dataset import PickleDataset

        if not self.built:
            raise _NotRun
        ds = PickleDataset(folder, index=self.index_dir, rebuild="never")
        want = _reference_samples(ref, path)[1] if ref is not None else None
        for i in range(len(ds)):
            got = ds[i]
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
    import faulthandler

    faulthandler.enable()
    spec = json.loads(Path(manifest).read_text())
    worker = _Worker(spec["index_dir"], spec["canary"])
    from .. import dataset, index, scan, spanread, wholefile  # noqa: F401 - imported before the limits

    _limit(memory, cpu)
    signal.signal(signal.SIGPROF, _on_alarm)
    with open(out_path, "a") as out:
        for name, folder in spec["cases"]:
            worker.run(name, folder, out)


# -- the driver -------------------------------------------------------------------------------


def _write_cases(cases: Sequence[Case], root: Path) -> list[tuple[str, str]]:
    out = []
    for k, case in enumerate(cases):
        folder = root / f"{k:05d}"
        folder.mkdir(parents=True)
        (folder / f"f{case.suffix}").write_bytes(case.data)
        if case.original is not None:
            (folder / _ORIGINAL).write_bytes(case.original)  # not a pickle name: never indexed
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
        __name__,
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
    if sys.argv[1:] == ["summary"]:
        sys.exit(_summary_main())
    _worker_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
