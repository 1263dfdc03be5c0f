"""Every code block in README.md runs, so the README cannot drift from the package.

Each ``python`` block runs as a script, and each ``sh`` block line by line through bash, in a fresh
directory that holds a small synthetic ``data/`` (written by ``pickleshard synth``, the same data
the blocks describe). The same files are in ``s3://my-bucket/pickles/`` on a moto S3 server on
127.0.0.1 that this module starts and stops, which the blocks reach through the standard AWS
environment variables (``AWS_ENDPOINT_URL``...), as a user's would reach their bucket. The blocks not run here are the set-up ones (``make demo`` /
``make test``, ``pip install``): CI runs ``make test`` itself, ``tests/test_without_torch.py``
runs the commands without torch, and the install was checked by hand (docs/development.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SET_UP = ("make demo", "make test", "pip install")


def _blocks() -> list[tuple[str, str, int]]:
    text = README.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        lang, body = match.group(1), match.group(2)
        line = text.count("\n", 0, match.start()) + 1
        if lang == "sh" and any(cmd in body for cmd in SET_UP):
            continue
        found.append((lang, body, line))
    return found


BLOCKS = _blocks()


def test_readme_has_runnable_blocks() -> None:
    langs = {lang for lang, _, _ in BLOCKS}
    assert {"python", "sh"} <= langs, f"README blocks found: {sorted(langs)}"
    assert all(lang in {"python", "sh"} for lang in langs), (
        f"a README block in a language this test cannot run: {sorted(langs)}"
    )


def _env() -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


@pytest.fixture(scope="module")
def s3_env(
    data_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The environment of a block: ``PATH`` with this interpreter's scripts, an S3 endpoint
    holding ``data/`` as ``my-bucket/pickles/``, and caches kept in a temporary directory."""
    from pickleshard.testing.servers import S3Server

    server = S3Server().start()
    try:
        files = {f"pickles/{p.name}": p.read_bytes() for p in sorted(data_template.glob("*.pkl"))}
        server.upload("my-bucket", files)
        home = tmp_path_factory.mktemp("readme-home")
        env = _env()
        env.update(
            AWS_ENDPOINT_URL=server.endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="eu-west-1",
            PICKLESHARD_INDEX_HOME=str(home / "remote-index"),
            HF_HOME=str(home / "hf"),
            HF_DATASETS_OFFLINE="1",
            HF_HUB_OFFLINE="1",
        )
        yield env
    finally:
        server.stop()


@pytest.fixture(scope="module")
def data_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readme-data")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pickleshard",
            "synth",
            str(root / "data"),
            "--files",
            "2",
            "--per-file",
            "100",
            "--shape",
            "3,8,8",
        ],
        check=True,
        capture_output=True,
        env=_env(),
    )
    return root / "data"


@pytest.mark.parametrize(
    ("lang", "body", "line"), BLOCKS, ids=[f"README.md:{line}" for _, _, line in BLOCKS]
)
def test_readme_block_runs(
    lang: str, body: str, line: int, data_template: Path, s3_env: dict[str, str], tmp_path: Path
) -> None:
    subprocess.run(["cp", "-r", str(data_template), str(tmp_path / "data")], check=True)
    if lang == "python":
        script = tmp_path / "snippet.py"
        script.write_text(body, encoding="utf-8")
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", body]
    done = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, env=s3_env, timeout=240
    )
    assert done.returncode == 0, (
        f"README.md line {line} ({lang}) failed with exit {done.returncode}:\n"
        f"{body}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )
