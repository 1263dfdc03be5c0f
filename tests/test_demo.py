"""The demo: trains one epoch on data it writes, and says where that data is and how to remove it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pickleshard.cli import main


def test_the_demo_says_where_its_data_is_and_how_to_remove_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    folder = tmp_path / "demo data"  # a space: the command it prints must quote it
    argv = ["demo", "--dir", str(folder), "--files", "1", "--per-file", "64", "--workers", "0"]
    assert main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert f"are in {folder.resolve()} ({size / (1 << 20):.0f} MiB)" in last
    command = last.split("remove them with: ")[1]
    assert shlex.split(command) == ["rm", "-r", str(folder.resolve())]
    assert (folder / ".pickleshard").is_dir()  # the index is in it too: one folder to remove
