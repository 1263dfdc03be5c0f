"""``inspect``: layout, samples and the globals audit of any pickle, without loading it.

The oracles: ``pickle.load`` for layouts and sample counts, and a recording unpickler (whose
``find_class`` notes every global it is asked for) for the audit. Canaries check that nothing a
file names is imported or run.
"""

from __future__ import annotations

import collections
import copyreg
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from conftest import BAD_FILES
from picklegen import LAYOUTS, build, datasets, dumps, oracle, write
from pickleshard.cli import main
from pickleshard.errors import (
    CorruptPickleError,
    NotAPickleError,
    NotSpanIndexableError,
    PickleshardError,
    TruncatedPickleError,
)
from pickleshard.inspect.file import FileReport, inspect_file
from pickleshard.picklekit.spanfile import SpanFile
from pickleshard.safety.allowlist import ALLOWED_GLOBALS, classify_global
from pickleshard.safety.audit.files import audit_buffer
from pickleshard.safety.inert import InspectUnpickler
from pickleshard.safety.standins import Opaque
from pickleshard.scan import scan_file

P4 = b"\x80\x04"


def _sg(module: str, name: str) -> bytes:
    """STACK_GLOBAL of two short strings."""
    m, n = module.encode(), name.encode()
    return b"\x8c" + bytes([len(m)]) + m + b"\x8c" + bytes([len(n)]) + n + b"\x93"


def _file(tmp_path: Path, data: bytes, name: str = "f.pkl") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _globals(report: FileReport) -> dict[str, tuple[int, int, str]]:
    return {g.qualname: (g.refs, g.calls, g.verdict) for g in report.globals}


class _Recorder(pickle._Unpickler):
    """The audit's oracle: every global the real unpickler looks up, with its count."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def find_class(self, module: str, name: str) -> Any:
        self.seen[(module, name)] += 1
        return super().find_class(module, name)


def _recorded(path: Path) -> collections.Counter[tuple[str, str]]:
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    size = path.stat().st_size
    with open(path, "rb") as fh:
        while fh.tell() < size:
            u = _Recorder(fh)
            u.load()
            seen += u.seen
    return seen


# -- layouts, protocols, samples ---------------------------------------------------------------

_LAYOUT_OF = {"columns_list": "columns", "appended_columns": "appended_columns"}


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_and_protocol(tmp_path: Path, layout: str, protocol: int) -> None:
    n = 6
    columns = [
        [np.full((2, 3), i, np.float32) for i in range(n)],
        list(range(n)),
        [f"s{i}" for i in range(n)],
    ]
    objs = build(layout, columns, ["img", "label", "text"])
    path = write(tmp_path / "f.pkl", objs, protocol)
    names, samples = oracle(path)
    r = inspect_file(path)
    assert r.protocol == protocol
    assert r.pickles == len(objs)
    assert r.layout == _LAYOUT_OF.get(layout, layout)
    assert r.fields == names
    assert r.samples == len(samples)
    assert r.span_indexable == (protocol >= 2), r.reason
    if protocol < 2:
        assert r.reason is not None
        assert "protocol 0 or 1" in r.reason
    img, label, text = (r.preview[f] for f in names)
    assert img == ["ndarray float32 (2, 3)"] * 3
    assert label == ["int 0", "int 1", "int 2"]
    assert text == ["str 's0'", "str 's1'", "str 's2'"]
    assert {g.verdict for g in r.globals} <= {"allowed"}


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_numpy_1x_and_2x_module_paths_are_both_allowed(tmp_path: Path, protocol: int) -> None:
    obj = ([np.arange(4.0), np.arange(4.0)], [1, 2])
    for numpy1 in (False, True):
        path = tmp_path / f"n{numpy1}.pkl"
        path.write_bytes(dumps(obj, protocol, numpy1=numpy1))
        r = inspect_file(path)
        assert r.preview["x"][0] == "ndarray float64 (4,)"
        modules = {g.module for g in r.globals}
        assert any(m.startswith("numpy.core." if numpy1 else "numpy._core.") for m in modules)
        assert r.verdict == "allowed"


def test_array_field_rows(tmp_path: Path) -> None:
    path = _file(tmp_path, pickle.dumps((np.zeros((7, 2, 3), "<i2"), list(range(7))), 5))
    r = inspect_file(path, samples=2)
    assert r.kinds == ("array_row", "pickle")
    assert r.samples == 7
    assert r.preview == {"x": ["ndarray int16 (2, 3)"] * 2, "y": ["int 0", "int 1"]}


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_torch_and_python_objects_are_summarised(tmp_path: Path, protocol: int) -> None:
    rows = [
        (torch.zeros(2, 3), {1, 2}, b"abc", 1.5, None, (1, 2), {"k": [1]}, True) for _ in range(2)
    ]
    r = inspect_file(_file(tmp_path, pickle.dumps(rows, protocol)), samples=1)
    assert r.layout == "rows"
    got = [r.preview[f][0] for f in r.fields or ()]
    assert got[0].startswith("torch.Tensor shape (2, 3)")
    assert got[1].startswith("set len=2")
    assert got[2] == "bytes len=3"
    assert got[3:6] == ["float 1.5", "NoneType None", "tuple len=2 (int 1, ...)"]
    assert got[6] == "dict len=1 ('k': list len=1)"
    assert got[7] == "bool True"
    assert "torch.storage._load_from_bytes" in _globals(r)
    assert r.verdict == "allowed"


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_any_pickle_gets_an_audit_even_without_a_layout(tmp_path: Path, protocol: int) -> None:
    config = {"lr": 0.1, "sched": collections.OrderedDict(a=1), "counts": collections.Counter("ab")}
    r = inspect_file(_file(tmp_path, pickle.dumps(config, protocol)))
    assert r.layout.startswith("unsupported: ")
    assert not r.span_indexable
    assert r.reason
    g = _globals(r)
    assert g["collections.OrderedDict"][2] == "allowed"
    assert g["collections.Counter"][2] == "not allowed"
    assert r.verdict == "not allowed"


def test_python_2_strings_follow_the_encoding(tmp_path: Path) -> None:
    # {"x": [1, 2], "y": ["ab", "cd"]} as Python 2 writes it: str is SHORT_BINSTRING
    data = (
        b"\x80\x02}q\x00(U\x01xq\x01]q\x02(K\x01K\x02eU\x01yq\x03]q\x04(U\x02abq\x05U\x02cdq\x06eu."
    )
    path = _file(tmp_path, data)
    assert pickle.loads(data) == {"x": [1, 2], "y": ["ab", "cd"]}
    r = inspect_file(path)
    assert (r.layout, r.fields) == ("dict_columns", ("x", "y"))
    assert r.preview["y"] == ["str 'ab'", "str 'cd'"]
    r = inspect_file(path, encoding="bytes")
    assert r.fields == ("x", "y")  # bytes keys name fields by their text (issue 14)
    assert r.preview["y"] == ["bytes len=2", "bytes len=2"]


def test_appended_pickles_are_counted(tmp_path: Path) -> None:
    data = b"".join(pickle.dumps((i, f"s{i}"), 4) for i in range(5))
    r = inspect_file(_file(tmp_path, data))
    assert (r.pickles, r.layout, r.samples, r.fields) == (5, "appended_samples", 5, ("x", "y"))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_preview_resolves_externals_across_appended_pickles(tmp_path: Path, protocol: int) -> None:
    """Samples that ``GET`` memo entries an earlier sample defined (a repeated key string, a
    dtype), in the second of two appended pickles (memo ids shifted): the preview resolves them
    through the one external-memo resolver, as ``pickle.load`` sees them."""
    from pickleshard.inspect.report import describe

    parts = [
        ([{"key": k * 10 + i, "arr": np.full(2, i, "<f4")} for i in range(3)], list(range(3)))
        for k in range(2)
    ]
    data = b"".join(pickle.dumps(p, protocol) for p in parts)
    r = inspect_file(_file(tmp_path, data), samples=6)
    assert r.span_indexable, r.reason
    assert r.layout == "appended_columns"
    want = [describe(x) for p in parts for x in p[0]]
    assert r.preview["x"] == want
    assert want[4] == "dict len=2 ('key': int 11, ...)"


def test_the_whole_file_reading_has_an_opcode_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pickleshard.inspect.file.WHOLE_FILE_OPCODES", 10)
    r = inspect_file(_file(tmp_path, pickle.dumps(([1, 2, 3], [4, 5, 6]), 0)))
    assert r.layout.startswith("unknown without loading")
    assert r.fields is None
    assert r.samples is None
    assert r.opcodes > 10


# -- the audit --------------------------------------------------------------------------------


# files written with numpy 1.x module paths load through numpy's deprecated numpy.core shims
@pytest.mark.filterwarnings("ignore:numpy.core:DeprecationWarning")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(datasets())
def test_audit_names_what_the_unpickler_looks_up(tmp_path_factory: Any, d: dict[str, Any]) -> None:
    path = tmp_path_factory.mktemp("audit") / "f.pkl"
    objs = build(d["layout"], d["columns"], d["names"])
    write(path, objs, d["protocol"], numpy1=d["numpy1"])
    data = path.read_bytes()
    audit = audit_buffer(data, len(data), str(path))
    assert dict(audit.refs) == dict(_recorded(path))
    assert len(audit.records) == len(objs)


def test_dangerous_not_allowed_and_allowed_verdicts(tmp_path: Path) -> None:
    body = b"".join(
        _sg(m, n) + b"\x94"
        for m, n in [
            ("os", "system"),
            ("posix", "system"),
            ("nt", "system"),
            ("subprocess", "Popen"),
            ("builtins", "eval"),
            ("builtins", "exec"),
            ("builtins", "__import__"),
            ("builtins", "getattr"),
            ("builtins", "compile"),
            ("builtins", "open"),
            ("pickle", "loads"),
            ("_pickle", "loads"),
            ("torch", "load"),
            ("shutil", "rmtree"),
            ("socket", "socket"),
            ("mymodule", "Model"),
            ("torch.storage", "_load_from_bytes"),
            ("builtins", "list"),
        ]
    )
    n = body.count(b"\x93")
    r = inspect_file(_file(tmp_path, P4 + b"(" + body + b"t."))
    g = _globals(r)
    assert len(g) == n
    allowed = {"torch.storage._load_from_bytes", "builtins.list"}
    for name, (_refs, _calls, verdict) in g.items():
        want = (
            "allowed" if name in allowed else "not allowed" if "mymodule" in name else "dangerous"
        )
        assert verdict == want, name
        module, _, attr = name.rpartition(".")
        assert classify_global(module, attr) == verdict
    assert r.verdict == "dangerous"
    assert {x.qualname for x in r.unsafe} == set(g) - allowed


def test_allow_globals_widens_verdicts(tmp_path: Path) -> None:
    path = _file(tmp_path, P4 + _sg("mymodule", "Model") + b")\x81.")
    assert inspect_file(path).verdict == "not allowed"
    r = inspect_file(path, allow_globals=["mymodule.Model"])
    assert r.verdict == "allowed"
    assert not r.unsafe


def test_stack_global_operands_through_the_memo(tmp_path: Path) -> None:
    # "os" stored at an explicit id, "system" by MEMOIZE (whose id is len(memo) = 1), both
    # popped, fetched back by GET: the audit must resolve them as the unpickler does
    data = (
        P4
        + b"\x8c\x02os\x94"  # MEMOIZE as 0
        + b"\x8c\x06system\x94"  # MEMOIZE as 1
        + b"00"
        + b"h\x00h\x01\x93"
        + b"\x8c\x05touch\x85R."
    )
    r = inspect_file(_file(tmp_path, data))
    assert _globals(r) == {"os.system": (1, 1, "dangerous")}
    assert r.counts == {"REDUCE": 1}
    sparse = P4 + b"\x8c\x02osq\x05\x8c\x06system\x94" + b"00h\x05h\x01\x93."
    assert _globals(inspect_file(_file(tmp_path, sparse, "s.pkl"))) == {
        "os.system": (1, 0, "dangerous")
    }


def test_computed_stack_global_is_dangerous(tmp_path: Path) -> None:
    # STACK_GLOBAL whose operands come out of a call: its name cannot be read from the bytes
    data = P4 + _sg("builtins", "str") + b"\x8c\x02os\x85R\x8c\x06system\x93."
    r = inspect_file(_file(tmp_path, data))
    assert _globals(r)["?.?"] == (1, 0, "dangerous")
    assert _globals(r)["builtins.str"] == (1, 1, "allowed")


def test_protocol_0_globals_inst_obj_and_ext(tmp_path: Path) -> None:
    data = b"cos\nsystem\n(S'touch x'\ntR(ibuiltins\nlist\n(cmymod\nK\no."
    r = inspect_file(_file(tmp_path, data))
    assert r.protocol == 1  # OBJ is a protocol 1 opcode
    g = _globals(r)
    assert g["os.system"] == (1, 1, "dangerous")
    assert g["builtins.list"] == (1, 1, "allowed")
    assert g["mymod.K"] == (1, 1, "not allowed")
    assert r.counts == {"REDUCE": 1, "INST": 1, "OBJ": 1}
    copyreg.add_extension("os", "system", 0x1234)
    try:
        ext = P4 + b"\x83" + struct.pack("<H", 0x1234) + b"\x84\x99\x99\x00\x00."
        r = inspect_file(_file(tmp_path, ext, "ext.pkl"))
    finally:
        copyreg.remove_extension("os", "system", 0x1234)
    g = _globals(r)
    assert g["os.system"][2] == "dangerous"
    assert g["copyreg.<extension 39321>"][2] == "not allowed"


# -- nothing runs -----------------------------------------------------------------------------


class _Canary:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def _record_stand_ins(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every value the one inert unpickler's ``find_class`` hands out, in order."""
    handed: list[Any] = []
    real = InspectUnpickler.find_class

    def find_class(self: InspectUnpickler, module: str, name: str) -> Any:
        handed.append(real(self, module, name))
        return handed[-1]

    monkeypatch.setattr(InspectUnpickler, "find_class", find_class)
    return handed


def test_scanner_and_preview_get_the_same_stand_in_and_run_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scanner's inspector and inspect's preview (span and whole-file) evaluate with one
    inert unpickler: a global outside its allowlist is an :class:`Opaque` for each, never run."""
    import pickleshard.inspect.file
    import pickleshard.scan.inspector

    assert pickleshard.scan.inspector.InspectUnpickler is pickleshard.inspect.file.InspectUnpickler
    canary = tmp_path / "canary"
    system = f"{os.system.__module__}.system"
    handed = _record_stand_ins(monkeypatch)
    # a top-level field that is no list: the scanner's inspector evaluates it
    field = _file(tmp_path, pickle.dumps((np.zeros((3, 2)), _Canary(canary)), 4), "field.pkl")
    with pytest.raises(NotSpanIndexableError):
        scan_file(field)
    by_scanner = [h for h in handed if getattr(h, "qualname", None) == system]
    handed.clear()
    r = inspect_file(_file(tmp_path, pickle.dumps(([_Canary(canary)], [1]), 4), "sample.pkl"))
    assert r.span_indexable
    assert r.preview["x"] == [f"{system}(...)"]
    by_preview = [h for h in handed if getattr(h, "qualname", None) == system]
    handed.clear()
    r = inspect_file(field)  # not span-indexable: the preview reads the whole file inertly
    assert not r.span_indexable
    assert r.layout == "samples", r.layout  # an array beside an object: one sample
    by_whole_file = [h for h in handed if getattr(h, "qualname", None) == system]
    for used in (by_scanner, by_preview, by_whole_file):
        assert used
        assert all(type(h) is Opaque for h in used), used
    assert not canary.exists()


def test_the_inert_allowlist_never_hands_out_an_allocating_class() -> None:
    """``numpy.ndarray`` called directly allocates from a shape: the scanner's inspector used to
    get the real class; now every user gets a checked stand-in, and the call is a refusal."""
    u = InspectUnpickler(SpanFile(lambda o, n: b"", 0, 0, 4), first_id=0, resolve=print)
    ndarray = u.find_class("numpy", "ndarray")
    assert type(ndarray) is Opaque
    assert type(ndarray((1 << 40,))) is Opaque
    assert any("numpy.ndarray" in t for t in u.refusals.texts), u.refusals.texts
    assert u.find_class("numpy", "dtype") is np.dtype


def test_the_inert_allowlist_is_part_of_the_loaders() -> None:
    """What the inert evaluation treats as real or evaluates, the loader allows: every other
    global is a stand-in for it, so an inert reading never trusts more than a load would."""
    from pickleshard.safety.inert import INERT_GLOBALS

    assert INERT_GLOBALS <= ALLOWED_GLOBALS
    u = InspectUnpickler(SpanFile(lambda o, n: b"", 0, 0, 4), first_id=0, resolve=print)
    for module, name in sorted(ALLOWED_GLOBALS - INERT_GLOBALS):
        assert type(u.find_class(module, name)) is Opaque, (module, name)


def test_build_on_an_inert_evaluator_changes_nothing(tmp_path: Path) -> None:
    """``BUILD`` with ``__defaults__`` state on each global the inert allowlist evaluates: the
    loader refuses BUILD on a global; the inert evaluation must not let a data file change a
    function of the inspecting process either (it once set ``_frombuffer.__defaults__``)."""
    from pickleshard.safety import inert

    before = {f: f.__defaults__ for f in (inert._frombuffer, inert._reconstruct, inert._encode)}
    state = b"N}\x8c\x0c__defaults__K\x01K\x00\x86\x85s\x86b"
    evil = [
        _sg(module, name) + state
        for module, name in [
            ("numpy._core.numeric", "_frombuffer"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("_codecs", "encode"),
        ]
    ]
    data = P4 + b"](" + b"".join(evil) + b"e](K\x00K\x01K\x02e\x86."
    for check_all in (False, True):
        r = inspect_file(_file(tmp_path, data, "evil.pkl"), check_all=check_all)
        assert r.span_indexable, r.reason
        assert sum("BUILD on global" in t for t in r.refusals) == 3, r.refusals
    assert {f: f.__defaults__ for f in before} == before
    good = _file(tmp_path, pickle.dumps(([np.zeros((2, 3))] * 4, [1] * 4), 5), "good.pkl")
    assert inspect_file(good).preview["x"][0] == "ndarray float64 (2, 3)"


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_a_system_call_is_reported_never_run(tmp_path: Path, protocol: int) -> None:
    canary = tmp_path / "canary"
    path = _file(tmp_path, pickle.dumps(([_Canary(canary)], [1]), protocol))
    r = inspect_file(path)
    assert not canary.exists()
    assert _globals(r)[f"{os.system.__module__}.system"] == (1, 1, "dangerous")
    assert r.preview["x"] == [f"{os.system.__module__}.system(...)"]
    assert main(["inspect", str(path)]) == 0
    assert main(["inspect", "--strict", str(path)]) == 3
    assert not canary.exists()


def test_a_module_named_by_the_file_is_never_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = tmp_path / "imported"
    (tmp_path / "canarymod.py").write_text(
        f"open({str(canary)!r}, 'w').close()\nclass Thing:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    protocol_0 = b"ccanarymod\nThing\n)\x81}b."
    protocol_4 = P4 + _sg("canarymod", "Thing") + b")\x81}b."
    for i, data in enumerate((protocol_0, protocol_4)):
        r = inspect_file(_file(tmp_path, data, f"{i}.pkl"))
        assert _globals(r) == {"canarymod.Thing": (1, 1, "not allowed")}
        assert r.layout == "unsupported: the top-level object is canarymod.Thing(...)"
    assert "canarymod" not in sys.modules
    assert not canary.exists()


def test_inspecting_a_torch_pickle_does_not_import_torch(tmp_path: Path) -> None:
    path = _file(tmp_path, pickle.dumps([(torch.zeros(3), 1)], 4))
    code = (
        "import sys\nfrom pickleshard.inspect.file import inspect_file\n"
        f"r = inspect_file({str(path)!r})\nprint(r.preview['x'][0], 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "False"
    assert out.stdout.startswith("torch.Tensor shape (3,)")


# -- cost -------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_payload_heavy_file_reads_a_tiny_fraction(tmp_path: Path, protocol: int) -> None:
    xs = [np.full(75_000, i, np.float64) for i in range(20)]  # 600 KB payloads
    path = _file(tmp_path, pickle.dumps((xs, list(range(20))), protocol))
    r = inspect_file(path)
    assert r.samples == 20
    assert r.preview["x"][0] == "ndarray float64 (75000,)"
    assert r.bytes_read < 0.001 * r.size, (r.bytes_read, r.size)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "data", "error"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_files_raise_pickleshard_errors(
    tmp_path: Path, case: str, data: bytes, error: str
) -> None:
    path = _file(tmp_path, data)
    with pytest.raises(PickleshardError) as info:
        inspect_file(path)
    assert type(info.value).__name__ == error, info.value
    assert str(path) in str(info.value)
    assert getattr(info.value, "offset", None) is not None


def test_truncation_at_every_opcode_boundary(tmp_path: Path) -> None:
    import pickletools

    data = pickle.dumps(([np.arange(3), "a"], {"k": (1, 2.5)}), 4)
    cuts = [pos for _, _, pos in pickletools.genops(data)][1:]
    for cut in cuts:
        with pytest.raises((TruncatedPickleError, NotAPickleError)) as info:
            inspect_file(_file(tmp_path, data[:cut]))
        assert info.value.offset is not None


@pytest.mark.parametrize(
    ("data", "error", "offset"),
    [
        (P4 + b"\x8e" + struct.pack("<Q", 2**62) + b"xx.", TruncatedPickleError, 2),
        (P4 + b"B" + struct.pack("<I", 2**31) + b".", TruncatedPickleError, 2),
        (b"\x80\x02T" + struct.pack("<i", -5) + b".", CorruptPickleError, 2),
        (P4 + b"h\x07.", CorruptPickleError, 2),  # GET of a memo id never stored
        (P4 + b"N(.", CorruptPickleError, 4),  # STOP on an empty slice above a MARK
        (P4 + b"e.", CorruptPickleError, 2),  # APPENDS without a MARK
        (P4 + b"}(K\x01u.", CorruptPickleError, 6),  # SETITEMS of an odd number of items
        (P4 + b"N\xff.", CorruptPickleError, 3),
        (P4 + b"N." + b"\x00\x00", NotAPickleError, 4),  # trailing junk
    ],
)
def test_lying_lengths_and_broken_structure(
    tmp_path: Path, data: bytes, error: type[Exception], offset: int
) -> None:
    path = _file(tmp_path, data)
    with pytest.raises(error) as info:
        inspect_file(path)
    assert isinstance(info.value, PickleshardError)
    assert info.value.offset == offset  # type: ignore[attr-defined]
    assert str(path) in str(info.value)


# -- the command ------------------------------------------------------------------------------


def test_cli_text_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xs = [np.zeros((3, 4), np.float32) for _ in range(5)]
    path = _file(tmp_path, pickle.dumps((xs, list(range(5))), 5))
    assert main(["inspect", str(path), "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: pickle protocol 5, 1 pickle, ")
    for text in (
        "layout   columns",
        "reading  span-indexable",
        "samples  5 per field (x, y)",
        "x  [0] ndarray float32 (3, 4)",
        "[1] int 1",
        "globals  2 (worst: allowed)",
        "allowed      numpy.dtype",
        "opcodes  ",
    ):
        assert text in out, text
    assert "[2]" not in out


def test_cli_json_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, pickle.dumps(([1, 2], ["a", "b"]), 4))
    assert main(["inspect", "--json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {
        "schema",
        "path",
        "size",
        "protocol",
        "pickles",
        "layout",
        "fields",
        "samples",
        "counts",
        "span_indexable",
        "reason",
        "kinds",
        "preview",
        "globals",
        "verdict",
        "opcodes",
        "computed_calls",
        "bytes_read",
        "bytes_fetched",
        "seconds",
        "allow_globals",
        "refusals",
        "compression",
        "ambiguity",
        "metadata",
    }
    assert doc["bytes_fetched"] is None or doc["bytes_fetched"] >= 0
    assert doc["schema"] == 1
    assert doc["layout"] == "columns"
    assert doc["fields"] == ["x", "y"]
    assert doc["counts"] == {"x": 2, "y": 2}
    assert doc["verdict"] is None
    assert doc["opcodes"]["total"] > 0
    assert doc["preview"]["y"] == ["str 'a'", "str 'b'"]


def test_cli_strict_exit_codes_and_directories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    good = _file(data, pickle.dumps(([1], [2]), 4), "good.pkl")
    model = _file(data, P4 + _sg("mymodule", "Model") + b")\x81.", "model.pkl")
    assert main(["inspect", "--strict", str(good)]) == 0
    assert main(["inspect", str(model)]) == 0
    assert main(["inspect", "--strict", str(model)]) == 3
    assert "pickleshard: strict: " in capsys.readouterr().err
    assert main(["inspect", "--strict", "--allow-global", "mymodule.Model", str(model)]) == 0
    capsys.readouterr()
    assert main(["inspect", "--strict", "--json", str(data)]) == 3
    docs = json.loads(capsys.readouterr().out)
    assert [Path(d["path"]).name for d in docs] == ["good.pkl", "model.pkl"]
    _file(data, b"", "empty.pkl")
    assert main(["inspect", "--strict", str(data)]) == 1  # an unreadable file is worst
    captured = capsys.readouterr()
    assert "pickleshard: error: " in captured.err
    assert "empty.pkl" in captured.err
    assert "good.pkl" in captured.out
    assert "model.pkl" in captured.out
    assert main(["inspect", str(data / "*.pkl"), "--json"]) == 1
    assert len(json.loads(capsys.readouterr().out)) == 3


def test_cli_bad_file_exits_1_with_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, b"not a pickle at all")
    assert main(["inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"pickleshard: error: {path} at byte 0: ")
    assert main(["inspect", str(tmp_path / "missing.pkl")]) == 1


def _deep_memo(n: int) -> bytes:
    """``([deep, 1], [0, 1])``, ``deep`` nested ``n`` lists built through the memo with a stack
    of two (``L_k = [L_{k-1}]``), so no opcode pass sees the depth on its stack."""
    p4 = struct.Struct("<I").pack
    body = [b"\x80\x04]r" + p4(0) + b"0"]
    body += [b"]r" + p4(k) + b"j" + p4(k - 1) + b"a0" for k in range(1, n)]
    return b"".join(body) + b"](j" + p4(n - 1) + b"K\x01e](K\x00K\x01e\x86."


def test_check_all_evaluates_a_whole_file_past_the_opcode_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample nested past max_depth in a file too long to preview: only ``check_all``
    (``--strict``) evaluates it, and then notes the refusal the loader would raise."""
    import pickleshard.inspect.file as inspection

    path = tmp_path / "deep.pkl"
    path.write_bytes(_deep_memo(300))
    assert pickle.loads(path.read_bytes())[1] == [0, 1]  # a valid pickle
    monkeypatch.setattr(inspection, "WHOLE_FILE_OPCODES", 100)
    assert not inspect_file(path).refusals  # over the budget: not evaluated
    refusals = inspect_file(path, check_all=True).refusals
    assert any("deeper than max_depth" in r for r in refusals), refusals
    assert main(["inspect", "--strict", str(path)]) == 3


def test_check_all_evaluates_span_samples_past_the_preview(tmp_path: Path) -> None:
    """An amplifying call in sample 7 of a span-indexable file: the preview of 3 samples does
    not reach it, ``--strict`` does."""
    xs = [bytes([65 + i]) * 4 for i in range(10)]
    path = tmp_path / "late.pkl"
    data = pickle.dumps((xs, list(range(10))), 4)
    # sample 7's x: bytes(10**9) by REDUCE, spliced in place of its b"HHHH"
    evil = b"\x8c\x08builtins\x8c\x05bytes\x93J" + struct.pack("<i", 10**9) + b"\x85R"
    at = data.index(b"C\x04HHHH")
    path.write_bytes(data[:at] + evil + data[at + 6 :])
    assert inspect_file(path, samples=3).span_indexable
    assert not inspect_file(path, samples=3).refusals
    assert any("bytes" in r for r in inspect_file(path, samples=3, check_all=True).refusals)


def test_strict_refuses_newobj_on_a_guarded_global(tmp_path: Path) -> None:
    """``bytes.__new__(bytes, 10**9)`` by NEWOBJ: the loader refuses it, so does --strict."""
    newobj = b"cbuiltins\nbytes\nJ" + struct.pack("<I", 10**9) + b"\x85\x81"
    path = tmp_path / "newobj.pkl"
    path.write_bytes(b"\x80\x02](" + newobj + b"K\x01e](K\x00K\x01e\x86.")
    refusals = inspect_file(path, check_all=True).refusals
    assert any("NEWOBJ" in r for r in refusals), refusals
    assert main(["inspect", "--strict", str(path)]) == 3
