"""The ``pickleshard`` command line: parsing, exit codes, and each command end to end."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pickleshard import open_dataset
from pickleshard.cli import main
from pickleshard.commands._common import parse_size
from pickleshard.formats import FORMAT_NAMES
from pickleshard.pipelines.synth import write_synthetic


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


def test_convert_choices_match_formats() -> None:
    from pickleshard.commands.convert import FORMATS

    assert FORMATS == FORMAT_NAMES


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from pickleshard.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "False"


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
