"""Faults through the command line and its APIs: every failure is one line naming the file.

Special files (FIFO, device, socket), a full disk during ``convert`` and ``split`` (an injected
``OSError(ENOSPC)`` at several points, and a real small tmpfs where this machine may mount one),
trailing bytes after a pickle in ``split``, lengths larger than the file, and the exceptions no
command should let through as a traceback (``MemoryError``, ``RecursionError``, ``OSError``,
``KeyboardInterrupt``).

Anything that could hang on a regression (a FIFO opened for reading blocks until a writer comes)
runs in a subprocess with a timeout: a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import PickleDataset
from pickleshard.cli import main
from pickleshard.errors import (
    NotAPickleError,
    NotRegularFileError,
    OutputSpaceError,
    TruncatedPickleError,
    UnsupportedLayoutError,
)
from pickleshard.formats import get_format, open_dataset
from pickleshard.formats.staging import Staging
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.split.run import split
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.testing.formats import tree_bytes

FORMATS = ("memmap", "lmdb", "webdataset")
SRC = Path(__import__("pickleshard").__file__).resolve().parents[1]  # the package under test


def one_line(err: str, *names: str) -> str:
    """The one error line of ``err``; fails unless it is exactly one line naming ``names``."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pickleshard: error: "), err
    for name in names:
        assert name in lines[0], (name, err)
    return lines[0]


def run_bounded(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in a new session; past ``timeout``, kill the whole process group (the
    workers a hung command forked too) and fail: a regression must fail, not hang or leak."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"hung for {timeout} s: {args[-1][:200]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


# ---- special files ------------------------------------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero_link(path: Path) -> None:
    path.symlink_to("/dev/zero")


@pytest.fixture
def socket_file() -> Iterator[Callable[[Path], None]]:
    held: list[socket.socket] = []

    def make(path: Path) -> None:
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.fspath(path))
        held.append(s)

    yield make
    for s in held:
        s.close()


SPECIAL = {
    "fifo": (_fifo, "FIFO"),
    "dev_zero_link": (_zero_link, "character device"),
}


def _special(kind: str, path: Path, socket_file: Callable[[Path], None]) -> str:
    if kind == "socket":
        if len(os.fspath(path)) > 100:  # AF_UNIX paths are short
            pytest.skip("temporary path too long for a unix socket")
        socket_file(path)
        return "socket"
    make, what = SPECIAL[kind]
    make(path)
    return what


KINDS = [*SPECIAL, "socket"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_special_files_are_refused_by_every_command(
    tmp_path: Path, kind: str, socket_file: Callable[[Path], None]
) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    write_synthetic(folder, files=1, per_file=3, shape=(2,))
    bad = folder / "data.pkl"
    what = _special(kind, bad, socket_file)
    commands = [
        ["index", str(folder)],
        ["index", str(bad)],
        ["index", str(folder / "*.pkl")],
        ["inspect", str(bad)],
        ["inspect", str(folder)],
        ["convert", str(folder), str(tmp_path / "out")],
        ["split", str(bad), str(tmp_path / "chunks"), "--max-samples", "1"],
    ]
    # One subprocess runs every command (main() in turn): a regression that opens the FIFO
    # hangs that process, and the timeout fails the test.
    code = (
        "import contextlib, io, json, sys\n"
        "from pickleshard.cli import main\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        rc = main(args)\n"
        "    print(json.dumps([rc, err.getvalue()]), flush=True)\n"
    )
    res = run_bounded([sys.executable, "-c", code, json.dumps(commands)], timeout=90)
    results = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(results) == len(commands), res.stdout + res.stderr
    for args, (rc, err) in zip(commands, results, strict=True):
        assert rc == 1, (args, err)
        line = one_line(err, "data.pkl", what)
        assert "not a regular file" in line
        assert "no such" not in line  # inspect used to call a FIFO missing
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_special_files_are_refused_by_the_api(
    tmp_path: Path, kind: str, socket_file: Callable[[Path], None]
) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    bad = folder / "data.pkl"
    _special(kind, bad, socket_file)
    # In a subprocess: a regression opens the FIFO, and that must fail the test, not hang it.
    code = (
        "import sys\n"
        "from pickleshard import PickleDataset\n"
        "from pickleshard.pipelines.split.run import split\n"
        "for call in (lambda: PickleDataset(sys.argv[1]), lambda: PickleDataset([sys.argv[2]]),\n"
        "             lambda: split(sys.argv[2], sys.argv[3], max_samples=1)):\n"
        "    try:\n        call()\n    except Exception as e:\n"
        "        print(type(e).__name__, getattr(e, 'path', ''))\n"
    )
    res = run_bounded(
        [sys.executable, "-c", code, str(folder), str(bad), str(tmp_path / "c")], timeout=60
    )
    lines = res.stdout.splitlines()
    assert len(lines) == 3, res.stdout + res.stderr
    for line in lines:
        assert line.split()[0] == "NotRegularFileError", line
        assert line.endswith("data.pkl"), line
    assert issubclass(NotRegularFileError, OSError)


def test_a_symlink_to_a_regular_file_is_still_read(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "real", files=1, per_file=3, shape=(2,))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "linked.pkl").symlink_to(next((tmp_path / "real").glob("*.pkl")))
    assert len(PickleDataset(tmp_path / "d")) == 3


# ---- split: trailing bytes ------------------------------------------------------------------------


@pytest.mark.parametrize("tail", [b"garbage!!", b"\x00" * 100, b"\x01junk"])
def test_split_names_trailing_bytes_and_their_offset(
    tmp_path: Path, tail: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    data = pickle.dumps([(np.arange(3), i) for i in range(10)], protocol=4)
    src = tmp_path / "data.pkl"
    src.write_bytes(data + tail)
    with pytest.raises(NotAPickleError) as info:
        split(src, tmp_path / "chunks", max_samples=3)
    assert info.value.offset == len(data)
    assert info.value.path == str(src)
    with pytest.raises(NotAPickleError):  # the dataset agrees
        PickleDataset(src)
    assert main(["split", str(src), str(tmp_path / "c2"), "--max-samples", "3"]) == 1
    one_line(capsys.readouterr().err, str(src), f"at byte {len(data)}")


def test_split_of_appended_tuples_of_different_widths_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "data.pkl"
    src.write_bytes(pickle.dumps((1, 2), 2) + pickle.dumps((3,), 2))
    assert main(["split", str(src), str(tmp_path / "c"), "--max-samples", "1"]) == 1
    one_line(capsys.readouterr().err, str(src))


# ---- lengths larger than the file -----------------------------------------------------------------


@pytest.mark.parametrize("command", ["index", "convert", "split"])
def test_a_huge_bytearray8_length_is_one_line_everywhere(
    tmp_path: Path, command: str, capfd: pytest.CaptureFixture[str]
) -> None:
    arr = pickle.dumps(([np.zeros(4, np.float32)], [1]), 5)
    at = arr.index(b"\x96")  # BYTEARRAY8
    folder = tmp_path / "d"
    folder.mkdir()
    src = folder / "data.pkl"
    src.write_bytes(arr[: at + 1] + (1 << 62).to_bytes(8, "little") + arr[at + 9 :])
    args = {
        "index": ["index", str(folder)],
        "convert": ["convert", str(folder), str(tmp_path / "out")],
        "split": ["split", str(src), str(tmp_path / "c"), "--max-samples", "1"],
    }[command]
    assert main(args) == 1
    err = capfd.readouterr().err  # capfd: CPython printed a stray SystemError at fd level
    line = one_line(err, "data.pkl", f"at byte {at}")
    assert "SystemError" not in err
    assert "payload" in line
    with pytest.raises(TruncatedPickleError):
        PickleDataset(folder, rebuild="auto")


# ---- big integers -------------------------------------------------------------------------------


@pytest.mark.parametrize("to", FORMATS)
def test_a_2mb_integer_converts_and_reads_back(
    tmp_path: Path, to: str, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = (1 << (8 * 2_000_000)) - 1
    (tmp_path / "src").mkdir()
    with open(tmp_path / "src" / "data.pkl", "wb") as fh:
        pickle.dump([(np.zeros(2), 1), (np.ones(2), huge), (np.ones(2), [-huge])], fh, 5)
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "src"), str(out), "--to", to, "--verify"]) == 0, (
        capsys.readouterr().err
    )
    ds = open_dataset(out, shuffle=False)
    got = list(ds) if to == "webdataset" else [ds[i] for i in range(len(ds))]
    assert got[1][1] == huge
    assert got[2][1] == [-huge]


# ---- a full disk ------------------------------------------------------------------------------


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write_synthetic(src, files=6, per_file=10, shape=(8, 8), seed=3)
    return src


def _enospc(what: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), what)


class _Faults:
    """Makes the ``n``-th call of a patched function raise ENOSPC (counting from 1)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def wrap(self, fn: Callable[..., Any], before: bool = True) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if before and self.calls == self.n:
                raise _enospc(str(args[0]) if args else "?")
            out = fn(*args, **kwargs)
            if not before and self.calls == self.n:
                raise _enospc("after")
            return out

        return patched


def _inject(monkeypatch: pytest.MonkeyPatch, to: str, point: str) -> int:
    """Patch one write of a ``to`` conversion to fail with ENOSPC; the parts done by then."""
    fmt_cls = type(get_format(to))
    if point == "part":  # the third part's writer fails on its first sample
        faults = _Faults(3)
        real = fmt_cls.part_writer

        def part_writer(self: Any, *args: Any) -> Any:
            writer = real(self, *args)
            faults.calls += 1
            if faults.calls == faults.n:
                writer.write = lambda *a: (_ for _ in ()).throw(_enospc("part"))
            return writer

        monkeypatch.setattr(fmt_cls, "part_writer", part_writer)
        return 2
    if point == "manifest":  # the manifest write recording the second part fails
        faults = _Faults(2)
        monkeypatch.setattr(Staging, "mark_done", faults.wrap(Staging.mark_done))
        return 1
    if point == "finalize":  # the format merged everything, then the disk filled
        faults = _Faults(1)
        monkeypatch.setattr(fmt_cls, "finalize", faults.wrap(fmt_cls.finalize, before=False))
        return -1  # all parts
    raise AssertionError(point)


@pytest.mark.parametrize("point", ["part", "manifest", "finalize"])
@pytest.mark.parametrize("to", FORMATS)
def test_enospc_is_one_error_and_a_rerun_resumes_to_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str, point: str
) -> None:
    src = _source(tmp_path)
    clean = convert(src, tmp_path / "clean", to=to, jobs=1)
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        done = _inject(m, to, point)
        with pytest.raises(OutputSpaceError) as info:
            convert(src, out, to=to, jobs=1)
    err = info.value
    assert isinstance(err, OSError)
    assert err.errno == errno.ENOSPC
    assert err.path == str(out.absolute())
    text = str(err)
    parts = clean.parts
    if done < 0:
        assert f"while merging the {parts} finished parts" in text
        done = parts
    else:
        assert f"after writing {done} of {parts} parts" in text
    assert "rerun the same command to resume" in text
    assert not out.exists()
    staging = tmp_path / ".out.partial"
    assert not list((staging / "parts").glob("*.tmp-*"))  # the half part was freed
    if point == "finalize":  # the half-merged output was freed too
        assert sorted(p.name for p in staging.iterdir()) == [".lock", "manifest.json", "parts"]
    report = convert(src, out, to=to, jobs=1)
    assert report.parts_reused == done
    assert tree_bytes(out) == tree_bytes(tmp_path / "clean")


@pytest.mark.parametrize("to", FORMATS)
def test_enospc_in_a_worker_process_is_the_same_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str
) -> None:
    src = _source(tmp_path)
    fmt_cls = type(get_format(to))
    real = fmt_cls.part_writer

    def part_writer(self: Any, part_dir: Path, spec: Any, options: Any) -> Any:
        if spec.id == 4:
            raise _enospc(str(part_dir))
        return real(self, part_dir, spec, options)

    monkeypatch.setattr(fmt_cls, "part_writer", part_writer)  # forked workers inherit it
    with pytest.raises(OutputSpaceError, match="rerun the same command"):
        convert(src, tmp_path / "out", to=to, jobs=2)
    monkeypatch.undo()
    report = convert(src, tmp_path / "out", to=to, jobs=2, verify=True)
    assert report.verified == 60


def test_enospc_through_the_cli_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _source(tmp_path)
    _inject(monkeypatch, "memmap", "part")
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--jobs", "1"]) == 1
    line = one_line(capsys.readouterr().err, str(out), "no space left on device")
    assert "after writing 2 of" in line
    assert "MB" in line


def test_split_enospc_keeps_finished_chunks_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pickleshard.pipelines.split.run as splitting

    src = tmp_path / "one.pkl"
    with open(src, "wb") as fh:
        pickle.dump([(np.full(4, i), i) for i in range(20)], fh, 5)
    faults = _Faults(3)
    monkeypatch.setattr(splitting, "write_chunk", faults.wrap(splitting.write_chunk))
    out = tmp_path / "chunks"
    assert main(["split", str(src), str(out), "--max-samples", "5"]) == 1
    line = one_line(capsys.readouterr().err, str(out))
    assert "no space left on device after writing 2 of 4 chunks" in line
    assert not list(out.glob("*.tmp-*"))
    monkeypatch.undo()
    report = split(src, out, max_samples=5)
    assert report.chunks_reused == 2
    got = [s for c in report.chunks for s in pickle.loads(c.read_bytes())]
    want = pickle.loads(src.read_bytes())
    assert len(got) == len(want)
    for (ga, gb), (wa, wb) in zip(got, want, strict=True):
        assert np.array_equal(ga, wa)
        assert gb == wb


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(exist_ok=True)
    try:
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", os.fspath(where)],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("to", FORMATS)
def test_a_real_full_tmpfs(tmp_path: Path, to: str, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    src = tmp_path / "src"
    write_synthetic(src, files=8, per_file=50, shape=(64, 64), seed=1)  # about 6.5 MB
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "3m")
    try:
        out = disk / "out"
        # one part at a time: with two writers racing for the last megabytes, both can fail
        # before either finishes, and how many parts were kept is then up to the scheduler
        args = ["convert", str(src), str(out), "--to", to, "--jobs", "1"]
        capsys.readouterr()
        assert main(args) == 1  # full while writing parts
        line = one_line(capsys.readouterr().err, str(out), "no space left on device", "rerun")
        kept = int(line.split("after writing ")[1].split(" of")[0])
        assert kept > 0
        # room for every part but not for the merged output too (memmap and lmdb copy them;
        # webdataset may fit)
        subprocess.run(["mount", "-o", "remount,size=9m", os.fspath(disk)], check=True)
        if main(args) == 1:
            line = one_line(capsys.readouterr().err, str(out), "no space left on device")
            assert "while merging the 8 finished parts" in line
            kept = 8
        else:
            assert to == "webdataset"
            printed = capsys.readouterr().out
            assert f"({kept} reused from an interrupted run)" in printed
            kept = 8
        subprocess.run(["mount", "-o", "remount,size=64m", os.fspath(disk)], check=True)
        assert main([*args, "--verify"]) == 0
        printed = capsys.readouterr().out
        assert "verified 400 samples" in printed
        assert "reused from an interrupted run" in printed or "already a complete" in printed
    finally:
        subprocess.run(["umount", "-l", os.fspath(disk)], check=False)


# ---- what no command lets through -------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "code", "words"),
    [
        (MemoryError(), 1, "out of memory"),
        (RecursionError("maximum recursion depth exceeded"), 1, "nested too deeply"),
        (PermissionError(errno.EACCES, "Permission denied", "/x/locked.pkl"), 1, "locked.pkl"),
        (_enospc("/x/out/part"), 1, "free space"),
        (KeyboardInterrupt(), 130, "interrupted"),
        (
            BrokenProcessPool("A process in the process pool was terminated"),
            1,
            "worker process died",
        ),
        (ZeroDivisionError("boom"), 1, "internal error"),
    ],
)
def test_unexpected_exceptions_are_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    exc: BaseException,
    code: int,
    words: str,
) -> None:
    import pickleshard.commands.index as index_cmd

    def fail(args: Any) -> int:
        raise exc

    monkeypatch.setattr(index_cmd, "run", fail)
    assert main(["index", str(tmp_path / "data")]) == code
    line = one_line(capsys.readouterr().err, words)
    if not isinstance(exc, OSError):
        assert str(tmp_path / "data") in line  # named by the command's path


def test_debug_shows_the_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pickleshard.commands.index as index_cmd

    def fail(args: Any) -> int:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(index_cmd, "run", fail)
    with pytest.raises(ZeroDivisionError):
        main(["--debug", "index", str(tmp_path)])


def test_no_progress_bar_when_stderr_is_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "data.pkl").write_bytes(b"not a pickle at all")
    assert main(["convert", str(tmp_path / "d"), str(tmp_path / "out")]) == 1
    one_line(capsys.readouterr().err, "data.pkl")


def test_ctrl_c_in_convert_says_a_rerun_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pickleshard.commands.convert as convert_cmd

    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_cmd, "run", interrupted)
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "src"), str(out)]) == 130
    line = one_line(capsys.readouterr().err, str(out), "interrupted")
    assert "rerun the same command to resume" in line


# ---- damaged conversions ------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("to", FORMATS)
def test_damaged_conversions_fail_verify_in_one_line(tmp_path: Path, to: str) -> None:
    src = _source(tmp_path)
    good = tmp_path / "good"
    convert(src, good, to=to, jobs=1)
    cases = []
    for f in sorted(p for p in good.rglob("*") if p.is_file() and p.suffix in (".mdb", ".npy")):
        for how in ("empty", "half", "garbled_header")[: 3 if f.suffix == ".npy" else 2]:
            case = tmp_path / f"{f.name}-{how}"
            shutil.copytree(good, case)
            data = f.read_bytes()
            damaged = {
                "empty": b"",
                "half": data[: len(data) // 2],
                "garbled_header": data[:12] + b"(" + data[13:],
            }[how]
            (case / f.relative_to(good)).write_bytes(damaged)
            cases.append(case)
    assert cases
    # In a subprocess: lmdb maps data.mdb, and a page past the end of a truncated file is a
    # SIGBUS that would take the test runner down with it.
    commands = [["verify", str(c)] for c in cases]
    code = (
        "import contextlib, io, json, sys\n"
        "from pickleshard.cli import main\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    err, out = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):\n"
        "        rc = main(args)\n"
        "    print(json.dumps([rc, err.getvalue()]), flush=True)\n"
    )
    res = run_bounded([sys.executable, "-c", code, json.dumps(commands)], timeout=150)
    assert res.returncode == 0, res.stderr[-2000:]
    results = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(results) == len(commands)
    for case, (rc, err) in zip(cases, results, strict=True):
        assert rc == 1, (case.name, err)
        line = one_line(err, str(case))
        assert "internal error" not in line, line


def test_split_of_appended_dicts_without_the_first_keys_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "data.pkl"
    src.write_bytes(pickle.dumps({"a": 1, "b": 2}, 2) + pickle.dumps({"a": 3}, 2))
    assert main(["split", str(src), str(tmp_path / "c"), "--max-samples", "1"]) == 1
    one_line(capsys.readouterr().err, str(src), "keys of the first")


@pytest.mark.parametrize(
    "objs",
    [[{1: 2}, [], [1, 2]], [{1: 2}, (1,), (1, 2)], [{"x": [1, 2]}, np.arange(3), (1, 2)]],
    ids=["dict_then_lists", "dict_then_tuples", "dict_then_array"],
)
def test_appended_dict_then_other_samples_is_a_layout_error(
    tmp_path: Path, objs: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "d").mkdir()
    src = tmp_path / "d" / "data.pkl"
    src.write_bytes(b"".join(pickle.dumps(o, 4) for o in objs))
    with pytest.raises(UnsupportedLayoutError, match="different shapes"):
        PickleDataset(tmp_path / "d")
    assert main(["index", str(tmp_path / "d")]) == 1
    one_line(capsys.readouterr().err, str(src), "different shapes")
