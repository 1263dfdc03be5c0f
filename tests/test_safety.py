"""Restricted unpickling in every read path: an unlisted global is refused by name, with the
file and where, and the two ways out (``trusted=True``, ``allow_globals=[...]``) both work;
nothing global (module switch, environment variable) turns the restriction off."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pickleshard
from pickleshard import build_index
from pickleshard.dataset import PickleDataset
from pickleshard.errors import AlreadyRegisteredError, UnsafePickleError
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.split.run import split
from pickleshard.read import SpanReader
from pickleshard.read.whole.load import load_file, load_records
from pickleshard.safety import allowlist
from pickleshard.safety import policy as safety
from pickleshard.safety.allowlist import preset_names, register_preset
from pickleshard.safety.policy import DEFAULT_POLICY, UnpicklePolicy
from pickleshard.scan import scan_file
from pickleshard.testing import SLOW_GLOBAL, SlowInt

SRC = Path(pickleshard.__file__).parent


class LocalPoint:
    """A class of the test module: never on any allowlist."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return type(other) is LocalPoint and other.x == self.x

    __hash__ = None  # type: ignore[assignment]


UNLISTED: dict[str, tuple[Any, str]] = {
    "counter": (Counter("aab"), "collections.Counter"),
    "local_class": (LocalPoint(3), f"{LocalPoint.__module__}.LocalPoint"),
}


def _write(folder: Path, obj: Any, protocol: int = 4) -> Path:
    """``(x, y)`` with the unlisted object as sample 1's ``y`` (sample 0 is plain)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "f.pkl"
    path.write_bytes(pickle.dumps(([10, 11, 12], [0, obj, 2]), protocol))
    return path


def _check_refusal(exc: UnsafePickleError, path: Path, name: str) -> None:
    message = str(exc)
    assert name in message, message
    assert os.path.basename(path) in message, message
    assert exc.offset is not None or exc.sample is not None, message
    assert "trusted=True" in message, message
    assert f"allow_globals=['{name}']" in message, message
    assert "--trusted" in message, message
    assert f"--allow-global {name}" in message, message


@pytest.fixture(params=sorted(UNLISTED))
def unlisted(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Any, str]:
    obj, name = UNLISTED[request.param]
    return _write(tmp_path / "data", obj), obj, name


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_whole_file_load_refuses(tmp_path: Path, protocol: int) -> None:
    path = _write(tmp_path / "data", Counter("ab"), protocol)
    with pytest.raises(UnsafePickleError) as info:
        load_file(path)
    _check_refusal(info.value, path, "collections.Counter")
    with pytest.raises(UnsafePickleError):
        load_records(path)


def test_whole_file_ways_out(unlisted: tuple[Path, Any, str]) -> None:
    path, obj, name = unlisted
    assert load_file(path, UnpicklePolicy.from_args(trusted=True))[1][1] == obj
    assert load_file(path, UnpicklePolicy.from_args(allow_globals=[name]))[1][1] == obj
    with pytest.raises(UnsafePickleError):  # allowing another global is not enough
        load_file(path, UnpicklePolicy.from_args(allow_globals=["fractions.Fraction"]))


def test_span_read_refuses(unlisted: tuple[Path, Any, str]) -> None:
    path, obj, name = unlisted
    scan = scan_file(path)
    reader = SpanReader(scan, find_class=DEFAULT_POLICY.find_class(path))
    assert reader.read_sample(0) == (10, 0)
    with pytest.raises(UnsafePickleError) as info:
        reader.read_sample(1)
    message = str(info.value)
    assert name in message
    assert os.fspath(path) in message
    assert "trusted=True" in message
    trusting = SpanReader(scan, find_class=UnpicklePolicy.from_args(trusted=True).find_class(path))
    assert trusting.read_sample(1) == (11, obj)
    allowing = UnpicklePolicy.from_args(allow_globals=[name]).find_class(path)
    assert SpanReader(scan, find_class=allowing).read_sample(1) == (11, obj)


def _read_all(folder: Path, mode: Any) -> None:
    ds = PickleDataset(folder, mode=mode)
    for i in range(len(ds)):
        ds[i]


def test_span_reader_is_restricted_by_default(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    path = _write(tmp_path / "data", _System(f"touch {canary}"))
    with SpanReader(scan_file(path)) as reader, pytest.raises(UnsafePickleError) as info:
        reader.read_sample(1)
    _check_refusal(info.value, path, "posix.system")
    assert not canary.exists()
    path = _write(tmp_path / "data", Counter("ab"))
    with SpanReader(scan_file(path), find_class=None) as trusting:  # None: the plain lookup
        assert trusting.read_sample(1) == (11, Counter("ab"))


@pytest.mark.parametrize("mode", ["span", "whole", "auto"])
def test_dataset_refuses_in_every_mode(unlisted: tuple[Path, Any, str], mode: str) -> None:
    path, obj, name = unlisted
    folder = path.parent
    with pytest.raises(UnsafePickleError) as info:
        _read_all(folder, mode)
    _check_refusal(info.value, path, name)
    trusted = PickleDataset(folder, mode=mode, trusted=True, rebuild="auto")  # type: ignore[arg-type]
    assert trusted[1] == (11, obj)
    allowed = PickleDataset(folder, mode=mode, allow_globals=[name], rebuild="auto")  # type: ignore[arg-type]
    assert allowed[1] == (11, obj)
    assert allowed.__getitems__([2, 1]) == [(12, 2), (11, obj)]


def test_dataset_span_refusal_names_the_sample(unlisted: tuple[Path, Any, str]) -> None:
    path, _, name = unlisted
    ds = PickleDataset(path.parent, mode="span", audit=False)  # the refusal at the read
    assert ds[0] == (10, 0)
    with pytest.raises(UnsafePickleError) as info:
        ds[1]
    assert info.value.sample == 1
    _check_refusal(info.value, path, name)


def test_build_index_refuses_files_it_unpickles(unlisted: tuple[Path, Any, str]) -> None:
    """Span indexing reads opcodes only (the refusal comes at read time, above); a file
    indexed whole is unpickled, and refused then."""
    path, _, name = unlisted
    with pytest.raises(UnsafePickleError) as info:
        build_index(path.parent, spans=False, jobs=1)
    _check_refusal(info.value, path, name)
    index = build_index(
        path.parent, spans=False, jobs=1, policy=UnpicklePolicy.from_args(allow_globals=[name])
    )
    assert index.num_samples == 3


def test_build_index_refuses_a_whole_file_fallback(tmp_path: Path) -> None:
    path = _write(tmp_path / "data", Counter("ab"), protocol=0)  # protocol 0: read whole
    with pytest.raises(UnsafePickleError) as info:
        build_index(path.parent, jobs=1)
    _check_refusal(info.value, path, "collections.Counter")


@pytest.mark.parametrize("jobs", [1, 2])
def test_convert_refuses(tmp_path: Path, jobs: int) -> None:
    path = _write(tmp_path / "data", LocalPoint(1))
    with pytest.raises(UnsafePickleError) as info:
        convert(tmp_path / "data", tmp_path / "out", jobs=jobs)
    _check_refusal(info.value, path, f"{LocalPoint.__module__}.LocalPoint")
    assert not (tmp_path / "out" / "descriptor.json").exists()


def test_convert_ways_out(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "f.pkl").write_bytes(pickle.dumps(([1, 2], [SlowInt(7, 0), 8]), 4))
    with pytest.raises(UnsafePickleError, match=re.escape(SLOW_GLOBAL)):
        convert(folder, tmp_path / "refused", jobs=1)
    report = convert(folder, tmp_path / "allowed", jobs=1, allow_globals=[SLOW_GLOBAL])
    assert report.num_samples == 2
    report = convert(folder, tmp_path / "trusted", jobs=1, trusted=True)
    assert report.num_samples == 2


@pytest.mark.parametrize(
    "reader",
    [
        lambda p: load_file(p),
        lambda p: SpanReader(scan_file(p), find_class=DEFAULT_POLICY.find_class(p)).read_sample(0),
        lambda p: PickleDataset(p.parent, mode="span")[0],
        lambda p: PickleDataset(p.parent, mode="whole")[0],
        lambda p: build_index(p.parent, spans=False, jobs=1),
        lambda p: convert(p.parent, p.parent.parent / "out", jobs=1),
        lambda p: convert(p.parent, p.parent.parent / "out", jobs=2, to="lmdb"),
        lambda p: split(p, p.parent.parent / "parts", max_samples=1),
    ],
    ids=[
        "whole",
        "span",
        "dataset-span",
        "dataset-whole",
        "index-whole",
        "convert",
        "convert-lmdb-2jobs",
        "split",
    ],
)
def test_dangerous_reduce_never_runs(tmp_path: Path, reader: Callable[[Path], Any]) -> None:
    canary = tmp_path / "canary"
    path = _write(tmp_path / "data", _System(f"touch {canary}"))
    path.write_bytes(pickle.dumps(([_System(f"touch {canary}"), 1], [0, 1]), 4))
    with pytest.raises(UnsafePickleError, match=r"system \(dangerous\)"):
        reader(path)
    assert not canary.exists()


class _System:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.cmd,))


# -- no global switch -------------------------------------------------------------------------


def test_no_environment_variable_or_module_switch_in_the_package() -> None:
    """The only ways out are the ``trusted`` / ``allow_globals`` arguments: no module reads the
    environment to decide safety, and the allowlist cannot be mutated."""
    # where caches live, nothing about what may load: these read only the variables named
    not_safety = {
        os.path.join("io", "remote", "listing.py"): {"XDG_CACHE_HOME", "INDEX_HOME_ENV"},
        os.path.join("io", "compressed", "cachedir.py"): {"XDG_CACHE_HOME"},
    }
    offenders = []
    for path in SRC.rglob("*.py"):
        if "testing" in path.parts:
            continue
        text = path.read_text()
        rel = os.fspath(path.relative_to(SRC))
        # every access: the variable's name for ``os.environ.get("NAME"``, "" for any other
        reads = re.findall(r"os\.environ(?:\.get\(\s*\"?(\w+))?|getenv\(", text)
        if any(name not in not_safety.get(rel, set()) for name in reads):
            offenders.append(rel)
    assert offenders == []
    assert isinstance(allowlist.ALLOWED_GLOBALS, frozenset)
    module_flags = [
        name
        for module in (safety, allowlist)
        for name, value in vars(module).items()
        if isinstance(value, bool)
        or (not callable(value) and re.search(r"(?i)trust|unsafe|disable|enable", name))
    ]
    assert module_flags == []
    assert UnpicklePolicy() == DEFAULT_POLICY
    assert not DEFAULT_POLICY.trusted
    with pytest.raises(AttributeError):
        DEFAULT_POLICY.trusted = True  # type: ignore[misc]


def test_environment_variables_do_not_disable_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "data", Counter("ab"))
    env = {
        **os.environ,
        **{
            f"PICKLESHARD_{k}": "1"
            for k in ("TRUSTED", "TRUST", "UNSAFE", "ALLOW_ALL", "NO_SAFETY", "DISABLE_SAFETY")
        },
        "PICKLESHARD_ALLOW_GLOBALS": "collections.Counter",
        "PICKLESHARD_ALLOW_GLOBAL": "collections.Counter",
    }
    code = (
        "import sys\n"
        "from pickleshard.read.whole.load import load_file\n"
        "from pickleshard.errors import UnsafePickleError\n"
        "try:\n"
        "    load_file(sys.argv[1])\n"
        "except UnsafePickleError:\n"
        "    sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    run = subprocess.run([sys.executable, "-c", code, os.fspath(path)], env=env, check=False)
    assert run.returncode == 0, "an environment variable lifted the restriction"


# -- presets: a registry that refuses silent replacement and never admits code ---------------


@pytest.fixture
def scratch_presets() -> Iterator[None]:
    """Presets registered by a test are removed after it (PRESETS is a view of this dict)."""
    saved = dict(allowlist._PRESETS)
    yield
    allowlist._PRESETS.clear()
    allowlist._PRESETS.update(saved)


def test_a_registered_preset_admits_its_globals_only_when_named(
    tmp_path: Path, scratch_presets: None
) -> None:
    path = _write(tmp_path / "data", Counter("aab"))
    register_preset("counters", ["collections.Counter"])
    assert allowlist.available_presets() == ("pandas", "dill", "pil", "scipy.sparse", "counters")
    assert allowlist.PRESETS["counters"] == frozenset({("collections", "Counter")})
    with pytest.raises(UnsafePickleError) as info:  # registering admits nothing by itself
        load_file(path)
    assert "allow='counters' (CLI: --allow counters)" in str(info.value)  # the refusal's advice
    with open(path, "rb") as fh:
        want = pickle.load(fh)
    assert load_file(path, UnpicklePolicy.from_args(allow_globals=preset_names("counters"))) == (
        want
    )
    ds = PickleDataset(tmp_path / "data", allow="counters", rebuild="auto")
    assert [ds[i] for i in range(len(ds))] == list(zip(*want, strict=True))


def test_register_preset_refuses_a_silent_replacement(scratch_presets: None) -> None:
    pandas = allowlist.PRESETS["pandas"]
    with pytest.raises(AlreadyRegisteredError, match="allow preset 'pandas' is already") as info:
        register_preset("pandas", ["collections.Counter"])
    assert isinstance(info.value, ValueError)
    assert "clobber=True" in str(info.value)
    assert allowlist.PRESETS["pandas"] == pandas
    for name, pairs in list(allowlist.PRESETS.items()):  # the same globals again: no change
        register_preset(name, [f"{m}:{n}" for m, n in pairs])
    register_preset("pandas", ["collections.Counter"], clobber=True)
    assert allowlist.PRESETS["pandas"] == frozenset({("collections", "Counter")})


@pytest.mark.parametrize(
    ("name", "entries", "error", "match"),
    [
        ("Not A Name", ["collections.Counter"], ValueError, "lowercase identifier"),
        ("empty", [], ValueError, "admits no globals"),
        ("oops", "collections.Counter", TypeError, "the string 'collections.Counter'"),
        ("bad", ["Counter"], ValueError, "look like 'module.name'"),
        ("shell", ["collections.Counter", "os.system"], ValueError, r"dangerous globals \(os"),
        ("gadget", ["operator.methodcaller"], ValueError, "dangerous"),
    ],
)
def test_register_preset_checks_its_name_and_globals(
    scratch_presets: None, name: str, entries: Any, error: type[Exception], match: str
) -> None:
    before = dict(allowlist.PRESETS)
    with pytest.raises(error, match=match):
        register_preset(name, entries)
    assert dict(allowlist.PRESETS) == before


def test_presets_are_a_read_only_view() -> None:
    with pytest.raises(TypeError):
        allowlist.PRESETS["mine"] = frozenset({("os", "system")})  # type: ignore[index]
    assert "mine" not in allowlist.PRESETS
