"""The ``pickleshard`` command line: parsing, exit codes, and each command end to end."""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import open_dataset
from pickleshard.cli import main
from pickleshard.commands._common import parse_size
from pickleshard.formats import FORMAT_NAMES, register_format, registry
from pickleshard.formats.memmap import MemmapFormat
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.safety import allowlist
from pickleshard.safety.allowlist import register_preset
from pickleshard.scan.layouts import LAYOUT_CHOICE_HELP, LAYOUT_CHOICES
from pickleshard.testing import assert_same


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("1000000", 1_000_000),
        ("256M", 256_000_000),
        ("256MB", 256_000_000),
        ("4KiB", 4096),
        ("1GiB", 1 << 30),
        ("1.5G", 1_500_000_000),
        (" 2 mib ", 2 << 20),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "-1", "12 parsecs", "0", "1e9"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="size"):
        parse_size(text)


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["inspect", "--help"], ["index", "--help"]],
    ids=["top", "inspect", "index"],
)
def test_help_does_not_import_torch(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from pickleshard.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'pickleshard.formats' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    lines = out.strip().splitlines()
    assert lines[-1] == "False False"
    if argv[0] == "convert":  # the built-in formats are offered without importing them
        assert "{memmap,lmdb,webdataset,parquet,arrow}" in "".join(lines[:-1]).replace(" ", "")


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere


# ---- the CLI's choices come from the registries ---------------------------------------------


class MirrorFormat(MemmapFormat):
    """A third-party format (memmap's files under a name of its own), registered by a test."""

    name = "memmap-mirror"


@pytest.fixture
def mirror_format(monkeypatch: pytest.MonkeyPatch) -> str:
    """``memmap-mirror`` registered for one test, then forgotten."""
    monkeypatch.setattr(registry, "_classes", dict(registry._classes))
    monkeypatch.setattr(registry, "_known", dict(registry._known))
    register_format(MirrorFormat)
    return MirrorFormat.name


def test_convert_to_a_registered_third_party_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mirror_format: str
) -> None:
    paths = write_synthetic(tmp_path / "src", files=2, per_file=5, shape=(3,), seed=4)
    offered = registry.available_formats()  # other test modules may have registered some too
    assert offered[: len(FORMAT_NAMES)] == FORMAT_NAMES  # the built-ins first
    assert offered[-1] == mirror_format
    assert "{" + ",".join(offered) + "}" in _help(capsys, "convert").replace(" ", "")
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "src"), str(out), "--to", mirror_format, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["to"] == mirror_format
    ds = open_dataset(out, shuffle=False)
    assert type(ds).__module__ == "pickleshard.formats.memmap"
    want = [s for p in sorted(paths) for s in zip(*pickle.loads(Path(p).read_bytes()), strict=True)]
    assert len(ds) == len(want) == 10
    for i, sample in enumerate(want):
        assert_same(ds[i], sample, f"sample {i}")


def test_convert_refuses_a_format_nobody_registered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["convert", str(tmp_path), str(tmp_path / "out"), "--to", MirrorFormat.name])
    assert exc.value.code == 2
    assert f"invalid choice: '{MirrorFormat.name}'" in capsys.readouterr().err


class Negated:
    """Pickles as ``abs(-v)``: a global (``builtins.abs``) that no allowlist admits."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __reduce__(self) -> tuple[Any, ...]:
        return (abs, (-self.v,))


@pytest.fixture
def absolutes_preset() -> Iterator[str]:
    """An ``absolutes`` preset (``builtins.abs``) registered for one test, then removed."""
    saved = dict(allowlist._PRESETS)
    register_preset("absolutes", ["builtins.abs"])
    yield "absolutes"
    allowlist._PRESETS.clear()
    allowlist._PRESETS.update(saved)


def test_allow_takes_a_registered_preset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], absolutes_preset: str
) -> None:
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "a.pkl"
    path.write_bytes(pickle.dumps(([1, 2, 3], [Negated(4), 5, Negated(6)]), 4))
    offered = allowlist.available_presets()
    assert offered[:4] == ("pandas", "dill", "pil", "scipy.sparse")
    assert offered[-1] == absolutes_preset
    assert f"also allow a vetted preset: {', '.join(offered)} (repeatable)" in _help(
        capsys, "convert"
    )
    src, jobs = str(tmp_path / "src"), ["--jobs", "1"]
    assert main(["convert", src, str(tmp_path / "refused"), *jobs]) == 1
    assert "builtins.abs (not allowed)" in capsys.readouterr().err
    assert main(["convert", src, str(tmp_path / "out"), *jobs, "--allow", absolutes_preset]) == 0
    ds = open_dataset(tmp_path / "out", shuffle=False)
    want = list(zip(*pickle.loads(path.read_bytes()), strict=True))
    assert [ds[i] for i in range(len(ds))] == want == [(1, 4), (2, 5), (3, 6)]


def test_allow_refuses_an_unknown_preset_naming_the_presets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["convert", str(tmp_path), str(tmp_path / "out"), "--allow", "absolutes"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'absolutes'" in err
    assert all(repr(name) in err for name in allowlist.PRESETS)


LOADING = ["index", "inspect", "convert", "verify", "split"]  # the commands that read pickles


@pytest.mark.parametrize("command", LOADING)
def test_every_loading_command_takes_the_same_safety_options(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    text = " ".join(_help(capsys, command).split())
    assert "safety (unpickling runs code; only allowlisted globals load):" in text
    for flag in ("--trusted", "--allow-global MODULE.NAME", "--allow PRESET", "--encoding"):
        assert flag in text


@pytest.mark.parametrize("command", LOADING)
def test_no_option_is_reachable_by_an_abbreviation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    paths = [str(tmp_path / "a.pkl"), str(tmp_path / "out")][: 1 if command == "inspect" else 2]
    for cut in (["--allow-g", "a.b"], ["--trust"], ["--allow", "pand"]):
        with pytest.raises(SystemExit) as exc:
            main([command, *paths, *cut])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "unrecognized arguments" in err or "invalid choice: 'pand'" in err
    with pytest.raises(SystemExit):
        main(["--deb", "index", str(tmp_path)])


def test_a_preset_given_as_a_global_points_to_allow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["inspect", str(tmp_path / "a.pkl"), "--allow-global", "pandas"])
    assert exc.value.code == 2
    assert "'pandas' is a preset: --allow pandas" in capsys.readouterr().err


def test_inspect_counts_allow_and_trusted_as_loading_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], absolutes_preset: str
) -> None:
    path = tmp_path / "a.pkl"
    path.write_bytes(pickle.dumps(([1, 2, 3], [Negated(4), 5, Negated(6)]), 4))
    assert main(["inspect", "--strict", str(path)]) == 3
    assert "builtins.abs (not allowed)" in capsys.readouterr().err
    assert main(["inspect", "--strict", str(path), "--allow", absolutes_preset]) == 0
    assert "allowed      builtins.abs" in capsys.readouterr().out
    assert main(["inspect", "--strict", str(path), "--trusted"]) == 0
    assert main(["index", str(path), "--index", str(tmp_path / "i"), "--trusted"]) == 0


@pytest.mark.parametrize("command", ["convert", "index", "inspect", "verify"])
def test_layout_help_reads_the_layout_choices(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    text = _help(capsys, command)
    assert "--layout {" + ",".join(LAYOUT_CHOICES) + "}" in text
    for choice in LAYOUT_CHOICES:
        assert " ".join(LAYOUT_CHOICE_HELP[choice].split()) in text


def test_bench_arguments_reach_the_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--help"])
    assert exc.value.code == 0
    assert "python -m bench" in capsys.readouterr().out


def test_convert_then_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_synthetic(tmp_path / "src", files=3, per_file=20, shape=(2, 3), seed=1)
    out = tmp_path / "out"
    args = ["--to", "webdataset", "--shard-bytes", "1KiB", "--verify", "--json"]
    rc = main(["convert", str(tmp_path / "src"), str(out), *args])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 60
    assert report["verified"] == 60
    assert len(list(out.glob("shard-*.tar"))) > 1  # --shard-bytes reached the writer
    ds = open_dataset(out, shuffle=False)
    assert len(ds) == 60

    assert main(["verify", str(tmp_path / "src"), str(out), "--sample", "7", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["checked"], report["total"], report["against"]) == (7, 60, "source")
    assert main(["verify", str(out)]) == 0
    assert "match the stored hashes" in capsys.readouterr().out


def test_verify_reports_a_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_synthetic(tmp_path / "src", files=2, per_file=10, shape=(4,), seed=2)
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "src"), str(out), "--json"]) == 0
    capsys.readouterr()
    x = out / "x.npy"
    arr = np.load(x, mmap_mode="r+")
    arr[3, 0] += 1
    arr.flush()
    del arr
    assert main(["verify", str(tmp_path / "src"), str(out)]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("pickleshard: error:")
    assert "sample 3" in err
    assert str(out) in err


def test_verify_takes_at_most_two_paths(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["verify", "a", "b", "c"])
    assert exc.value.code == 2
    assert "[SRC] OUT" in capsys.readouterr().err


def test_errors_exit_1_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.pkl").write_bytes(b"definitely not a pickle")
    assert main(["index", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "bad.pkl" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("obj", "said"),
    [
        (([1, 2], [3, 4]), "columns (a tuple or list of columns)"),
        ({"x": [1, 2], "y": [3, 4]}, "columns (a dict of columns)"),
        ([(1, 3), (2, 4)], "records (a list of tuples)"),
        ([{"x": 1, "y": 3}, {"x": 2, "y": 4}], "records (a list of dicts)"),
    ],
)
def test_layouts_are_named_as_layout_takes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], obj: Any, said: str
) -> None:
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "a.pkl"
    path.write_bytes(pickle.dumps(obj, 5))
    assert main(["inspect", str(path)]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("  layout "))
    assert line == f"  layout   {said}"
    assert said.split()[0] in LAYOUT_CHOICES
    assert "_" not in line  # no internal name (dict_rows) that --layout refuses
    assert main(["index", str(tmp_path / "d")]) == 0
    assert f"; layout {said};" in capsys.readouterr().out
