"""Everything that does not train works where torch cannot be imported (torch is an extra).

Each check runs in a subprocess whose ``sitecustomize`` puts a finder first on ``sys.meta_path``
that refuses ``torch`` and its submodules, as an environment without torch would; the subprocess
first proves the block holds, so a check cannot pass by importing torch after all.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pickleshard
from conftest import oracle_samples

_BLOCKER = """
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
"""


@pytest.fixture
def no_torch_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_BLOCKER)
    src = Path(pickleshard.__file__).resolve().parents[1]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(src)])}


def _python(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _cli(env: dict[str, str], cwd: Path, *args: str) -> str:
    done = _python(env, cwd, "-m", "pickleshard", *args)
    assert done.returncode == 0, f"pickleshard {' '.join(args)}:\n{done.stderr}"
    return done.stdout


def test_the_blocker_holds(no_torch_env: dict[str, str], tmp_path: Path) -> None:
    done = _python(no_torch_env, tmp_path, "-c", "import torch")
    assert done.returncode != 0
    assert "No module named 'torch'" in done.stderr


def test_the_commands_run_without_torch(no_torch_env: dict[str, str], tmp_path: Path) -> None:
    _cli(
        no_torch_env, tmp_path, "synth", "data", "--files", "2", "--per-file", "50", "--shape", "4"
    )
    summary = json.loads(_cli(no_torch_env, tmp_path, "index", "data", "--json"))
    assert summary["samples"] == 100
    assert "samples  50" in _cli(no_torch_env, tmp_path, "inspect", "data/part-00000.pkl")
    for fmt in ("memmap", "lmdb", "webdataset"):
        _cli(no_torch_env, tmp_path, "convert", "data", f"out-{fmt}", "--to", fmt)
        assert "ok: 100 of 100" in _cli(no_torch_env, tmp_path, "verify", "data", f"out-{fmt}")
    _cli(no_torch_env, tmp_path, "split", "data/part-00000.pkl", "chunks", "--max-bytes", "1000")
    assert len(list((tmp_path / "chunks").glob("*.pickle"))) > 1


def test_the_demo_names_the_extra_it_needs(no_torch_env: dict[str, str], tmp_path: Path) -> None:
    done = _python(no_torch_env, tmp_path, "-m", "pickleshard", "demo", "--files", "1")
    assert done.returncode == 1
    assert "pip install 'pickleshard[torch]'" in done.stderr
    assert "internal error" not in done.stderr


_READ = """
import sys
from pickleshard import MixedDataset, PickleDataset, ShuffleSampler, BlockShuffleSampler
ds = PickleDataset(sys.argv[1])
order = list(ShuffleSampler(ds, seed=1))
blocks = list(BlockShuffleSampler(ds, batch_size=4))
mixed = MixedDataset([ds, ds], [1, 1], epoch_size=4)
assert sorted(order) == list(range(len(ds))) and sorted(blocks) == sorted(order)
assert len(mixed) == 4 and len(mixed[0]) == 2
assert "torch" not in sys.modules
print(repr([ds[i][1] for i in range(len(ds))]))
print(repr([s[1] for s in ds.__getitems__(list(range(len(ds))))]))
print(ds.file_modes)
"""


@pytest.mark.parametrize("protocol", [0, 5])  # protocol 0 is read whole, 5 by span
def test_dataset_reads_without_torch(
    no_torch_env: dict[str, str], tmp_path: Path, protocol: int
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(protocol)
    obj = ([rng.random(3, dtype=np.float32) for _ in range(12)], list(range(12)))
    with open(data / "a.pkl", "wb") as fh:
        pickle.dump(obj, fh, protocol=protocol)
    done = _python(no_torch_env, tmp_path, "-c", _READ, str(data))
    assert done.returncode == 0, done.stderr
    by_item, by_batch, modes = done.stdout.splitlines()
    want = repr([int(s[1]) for s in oracle_samples(data / "a.pkl")])
    assert by_item == want
    assert by_batch == want
    assert ("whole" if protocol == 0 else "span") in modes
