"""Fault corpus, safety part: a data file may not change the process (``BUILD`` on a global),
turn a few bytes into gigabytes (amplifiers), or hand out a sample too big or too deep to
collate, convert or send between processes; each ends in the package's error naming the file
(and the sample), in every read mode and through a DataLoader with workers. Legit data still
loads exactly as ``pickle.load`` reads it."""

from __future__ import annotations

import collections
import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import PickleDataset
from pickleshard.errors import (
    CorruptPickleError,
    PickleshardError,
    SampleTooDeepError,
    SampleTooLargeError,
    UnsafePickleError,
)

torch = pytest.importorskip("torch")

MODES = ("auto", "whole", "span")


def _file(folder: Path, sample: bytes, name: str = "f.pkl") -> Path:
    """A protocol 2 ``([0, <sample>], [0, 1])``: sample 1's x is the opcodes ``sample``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"\x80\x02](K\x00" + sample + b"e](K\x00K\x01e\x86.")
    return path


def _read_all(folder: Path, mode: str, **kwargs: Any) -> list[Any]:
    ds = PickleDataset(folder, mode=mode, **kwargs)
    return [ds[i] for i in range(len(ds))]


def _refused(folder: Path, path: Path, mode: str, cls: type[Exception], *words: str) -> Exception:
    with pytest.raises(cls) as info:
        _read_all(folder, mode)
    text = str(info.value)
    assert str(path) in text
    for w in words:
        assert w in text, text
    return info.value


# -- BUILD on a global ---------------------------------------------------------------------------

_NEG_DEFAULTS = (
    b"N}X\x0c\x00\x00\x00__defaults__}X\x03\x00\x00\x00neg\x88s\x85s\x86b"  # (None, {...}) BUILD
)


def _arange_through_torch_load() -> list[float]:
    buf = io.BytesIO()
    torch.save(torch.arange(3.0), buf)
    buf.seek(0)
    return list(torch.load(buf, weights_only=True).tolist())


@pytest.mark.parametrize("mode", MODES)
def test_build_on_a_global_is_refused_and_changes_nothing(tmp_path: Path, mode: str) -> None:
    """The issue's case: BUILD sets ``_rebuild_tensor_v2.__defaults__`` so that every later
    ``torch.load`` negates its tensors. Refused, naming the global, file and sample; an
    unrelated ``torch.load`` afterwards reads arange(3) right."""
    fn = torch._utils._rebuild_tensor_v2
    before = fn.__defaults__
    try:
        path = _file(tmp_path, b"ctorch._utils\n_rebuild_tensor_v2\n" + _NEG_DEFAULTS)
        err = _refused(tmp_path, path, mode, UnsafePickleError, "BUILD", "_rebuild_tensor_v2")
        assert fn.__defaults__ == before
        assert _arange_through_torch_load() == [0.0, 1.0, 2.0]
        if mode == "whole":  # the offset of the BUILD opcode itself
            assert path.read_bytes()[err.offset] == pickle.BUILD[0]  # type: ignore[attr-defined]
        else:
            assert err.sample == 1  # type: ignore[attr-defined]
    finally:
        fn.__defaults__ = before


@pytest.mark.parametrize("mode", MODES)
def test_build_through_the_memo_on_a_numpy_function(tmp_path: Path, mode: str) -> None:
    module = "numpy._core" if int(np.__version__.split(".")[0]) >= 2 else "numpy.core"
    fn = __import__(f"{module}.numeric", fromlist=["_frombuffer"])._frombuffer
    before = dict(vars(fn))
    try:
        opcodes = (
            f"c{module}.numeric\n_frombuffer\n".encode() + b"q\x070h\x07}X\x01\x00\x00\x00zK\x01sb"
        )
        path = _file(tmp_path, opcodes)
        _refused(tmp_path, path, mode, UnsafePickleError, "BUILD", "_frombuffer")
        assert dict(vars(fn)) == before
    finally:
        vars(fn).clear()
        vars(fn).update(before)


# -- amplifiers ----------------------------------------------------------------------------------

_RANGE = b"c__builtin__\nrange\nJ\x00-1\x01\x85R"  # range(20_000_000)
AMPLIFIERS: dict[str, tuple[bytes, str]] = {
    "bytearray_from_int": (b"c__builtin__\nbytearray\nJ\x00/hY\x85R", "bytearray"),
    "bytes_from_int": (b"c__builtin__\nbytes\nJ\x00\xca\x9a;\x85R", "bytes"),
    "tuple_of_range": (b"c__builtin__\ntuple\n" + _RANGE + b"\x85R", "tuple"),
    "list_of_range": (b"c__builtin__\nlist\n" + _RANGE + b"\x85R", "list"),
    "set_of_range": (b"cbuiltins\nset\n" + _RANGE + b"\x85R", "set"),
    "frozenset_of_range": (b"c__builtin__\nfrozenset\n" + _RANGE + b"\x85R", "frozenset"),
    "torch_size_of_range": (b"ctorch\nSize\n" + _RANGE + b"\x85R", "torch.Size"),
    "encode_hex": (b"c_codecs\nencode\nX\x02\x00\x00\x00abX\x03\x00\x00\x00hex\x86R", "encode"),
    "reconstruct_shape": (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nJ\x00\xe1\xf5\x05\x85U\x01b\x87R",
        "_reconstruct",
    ),
    "scalar_itemsize": (
        b"cnumpy.core.multiarray\nscalar\ncnumpy\ndtype\nX\x0b\x00\x00\x00V2000000000"
        b"\x89\x88\x87RN\x86R",
        "scalar",
    ),
    "scalar_short_bytes": (
        b"cnumpy.core.multiarray\nscalar\ncnumpy\ndtype\nX\x02\x00\x00\x00f8\x89\x88\x87R"
        b"c_codecs\nencode\nX\x01\x00\x00\x00aX\x06\x00\x00\x00latin1\x86R\x86R",
        "scalar",
    ),
    "ndarray_call": (b"cnumpy\nndarray\nJ\x00\xe1\xf5\x05\x85R", "numpy.ndarray"),
    "tensor_call": (b"ctorch\nTensor\nJ\x00\xe1\xf5\x05\x85R", "torch.Tensor"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(AMPLIFIERS))
def test_amplifiers_are_refused_naming_the_global(tmp_path: Path, case: str, mode: str) -> None:
    opcodes, name = AMPLIFIERS[case]
    path = _file(tmp_path, opcodes)
    err = _refused(tmp_path, path, mode, UnsafePickleError, name)
    if mode != "whole":
        assert err.sample == 1  # type: ignore[attr-defined]
    else:  # the offset of the refused call, not of the file's start
        assert err.offset is not None
        assert err.offset > 0


@pytest.mark.parametrize("mode", MODES)
def test_newobj_of_bytes_allocates_nothing(tmp_path: Path, mode: str) -> None:
    """``bytes.__new__(bytes, 10**9)``: NEWOBJ needs a type; the guard is none, so it fails,
    reported as the refusal it is."""
    path = _file(tmp_path, b"c__builtin__\nbytes\nJ\x00\xca\x9a;\x85\x81")
    _refused(tmp_path, path, mode, UnsafePickleError, "NEWOBJ")


# -- bounds ---------------------------------------------------------------------------------------


def _deep(n: int) -> bytes:
    return b"]" * n + b"a" * (n - 1)


@pytest.mark.parametrize("mode", MODES)
def test_a_sample_nested_a_million_deep_is_refused(tmp_path: Path, mode: str) -> None:
    path = _file(tmp_path, _deep(10**6))
    err = _refused(tmp_path, path, mode, SampleTooDeepError, "max_depth=100")
    assert err.sample == 1  # type: ignore[attr-defined]


def test_depth_and_size_bounds_are_parameters(tmp_path: Path) -> None:
    _file(tmp_path, _deep(150))
    assert len(_read_all(tmp_path, "auto", max_depth=200)) == 2
    with pytest.raises(SampleTooDeepError):
        _read_all(tmp_path, "auto", max_depth=120)
    with pytest.raises(ValueError, match="max_depth must be a positive int"):
        PickleDataset(tmp_path, max_depth=0)


@pytest.mark.parametrize("mode", MODES)
def test_max_sample_bytes_counts_shared_references_again(tmp_path: Path, mode: str) -> None:
    """A list of 1000 references to one 1 MB array: 1 MB in memory, 1 GB once collated."""
    arr = np.zeros(1 << 20, np.uint8)
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps(([0, [arr] * 1000], [0, 1]), 4))
    with pytest.raises(SampleTooLargeError) as info:
        _read_all(tmp_path, mode, max_sample_bytes=100 << 20)
    assert str(path) in str(info.value)
    assert info.value.sample == 1
    assert len(_read_all(tmp_path, mode, max_sample_bytes=2 << 30)) == 2


def test_a_sample_that_contains_itself_is_refused(tmp_path: Path) -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps(([0, loop], [0, 1]), 4))
    with pytest.raises(SampleTooDeepError, match="contains itself"):
        _read_all(tmp_path, "auto")


def test_getitems_checks_every_sample(tmp_path: Path) -> None:
    path = _file(tmp_path, _deep(500))
    ds = PickleDataset(tmp_path)
    with pytest.raises(SampleTooDeepError) as info:
        ds.__getitems__([0, 1])
    assert info.value.sample == 1
    assert str(path) in str(info.value)


# -- DataLoader with workers: the package's error in the main process, never a hang --------------

DATALOADER_CASES = {
    "huge_bytearray": (AMPLIFIERS["bytearray_from_int"][0], UnsafePickleError),
    "range_amplifier": (AMPLIFIERS["tuple_of_range"][0], UnsafePickleError),
    "deep_nesting": (_deep(10**6), SampleTooDeepError),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(DATALOADER_CASES))
def test_dataloader_workers_raise_the_package_error(tmp_path: Path, case: str) -> None:
    from torch.utils.data import DataLoader

    opcodes, cls = DATALOADER_CASES[case]
    path = _file(tmp_path, opcodes)
    ds = PickleDataset(tmp_path)
    loader = DataLoader(ds, batch_size=1, num_workers=2, collate_fn=lambda b: b)
    with pytest.raises(cls) as info:
        list(loader)
    assert str(path) in str(info.value)


def test_errors_survive_dataloader_reraise() -> None:
    """torch re-raises a worker's error as ``exc_type(message)``: one argument."""
    from torch._utils import ExceptionWrapper

    for cls in (UnsafePickleError, SampleTooDeepError, SampleTooLargeError, CorruptPickleError):
        try:
            raise cls("/data/f.pkl", "bad", sample=3)
        except PickleshardError:
            wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
        with pytest.raises(cls, match=r"f\.pkl"):
            wrapped.reraise()


# -- legit data: what pickle.load reads ------------------------------------------------------------


def _legit_values() -> list[Any]:
    arrays = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(5, dtype=">i8"),
        np.array([1 + 2j], np.complex64),
        np.zeros((0, 3)),
        np.array(["ab", "c"]),
        np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    ]
    return [
        *arrays,
        np.float64(1.5),
        np.int16(-3),
        np.str_("xy"),
        np.dtype("V8"),
        torch.arange(4.0),
        torch.Size([2, 3]),
        collections.OrderedDict(a=1, b=[2]),
        {1, 2},
        frozenset({"a"}),
        b"bytes",
        bytearray(b"ba"),
        b"",
        {"x": np.ones(3), "y": 2},
    ]


@pytest.mark.parametrize("protocol", range(6))
@pytest.mark.parametrize("mode", ["auto", "whole"])
def test_legit_values_load_as_pickle_load(tmp_path: Path, protocol: int, mode: str) -> None:
    values = _legit_values()
    if protocol < 2:
        values = [v for v in values if not isinstance(v, torch.Tensor)]
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps((values, list(range(len(values)))), protocol))
    with open(path, "rb") as fh:
        want = pickle.load(fh)
    got = _read_all(tmp_path, mode)
    for (x, y), w, wy in zip(got, want[0], want[1], strict=True):
        assert y == wy
        assert type(x) is type(w)
        if isinstance(w, np.ndarray):
            assert x.dtype == w.dtype
            assert x.shape == w.shape
            assert x.tobytes() == w.tobytes()
        elif isinstance(w, torch.Tensor):
            assert torch.equal(x, w)
        elif isinstance(w, dict) and "x" in w:
            assert np.array_equal(x["x"], w["x"])
            assert x["y"] == w["y"]
        else:
            assert x == w


def test_python2_latin1_numpy_pickle_loads(tmp_path: Path) -> None:
    """A Python 2 pickle of numpy data (str payloads: SHORT_BINSTRING / BINSTRING) read with
    ``encoding='latin1'``: the guards accept its _reconstruct/scalar forms."""
    arr = np.arange(4, dtype=np.int32)
    raw = arr.tobytes()
    dtype = b"cnumpy\ndtype\nU\x02i4K\x00K\x01\x87R(K\x03U\x01<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
        + b"(K\x01K\x04\x85"
        + dtype
        + b"\x89U"
        + bytes([len(raw)])
        + raw
        + b"tb"
    )
    scalar = b"cnumpy.core.multiarray\nscalar\n" + dtype + b"U\x04\x07\x00\x00\x00\x86R"
    path = tmp_path / "f.pkl"
    path.write_bytes(b"\x80\x02](" + array + scalar + b"e](K\x00K\x01e\x86.")
    with open(path, "rb") as fh:
        want = pickle.load(fh, encoding="latin1")
    for mode in ("auto", "whole"):
        got = _read_all(tmp_path, mode, encoding="latin1")
        assert np.array_equal(got[0][0], want[0][0])
        assert got[0][0].dtype == want[0][0].dtype
        assert got[1][0] == want[0][1]
        assert type(got[1][0]) is type(want[0][1])


def test_guards_pickle_back_to_their_globals(tmp_path: Path) -> None:
    """A sample holding a guarded global itself (rare) still pickles (a DataLoader worker sends
    it) and loads back as the original global."""
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps(([0, torch._utils._rebuild_tensor_v2, tuple], [0, 1, 2]), 2))
    ds = PickleDataset(tmp_path)
    back = pickle.loads(pickle.dumps([ds[1][0], ds[2][0]]))
    assert back == [torch._utils._rebuild_tensor_v2, tuple]
    assert ds[1][0] == torch._utils._rebuild_tensor_v2


# -- inspect --strict refuses what loading refuses -----------------------------------------------


def _nested_torch_payload(tmp_path: Path) -> Path:
    """A tensor-like ``torch.storage._load_from_bytes`` payload whose nested pickle (the torch
    zip's data.pkl) calls ``posix.system``."""
    import zipfile

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("echo pwned",))

    saved = io.BytesIO()
    torch.save({"a": 1}, saved)
    zipped = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(saved.getvalue())) as zin,
        zipfile.ZipFile(zipped, "w") as zout,
    ):
        for info in zin.infolist():
            body = zin.read(info)
            zout.writestr(info, pickle.dumps(Evil(), 2) if info.filename.endswith(".pkl") else body)
    payload = zipped.getvalue()
    opcodes = (
        b"ctorch.storage\n_load_from_bytes\nB"
        + len(payload).to_bytes(4, "little")
        + payload
        + b"\x85R"
    )
    return _file(tmp_path, opcodes)


STRICT_CASES: dict[str, tuple[bytes, str]] = {
    "build_on_global": (
        b"ctorch._utils\n_rebuild_tensor_v2\n" + _NEG_DEFAULTS,
        "BUILD on global torch._utils._rebuild_tensor_v2",
    ),
    "build_through_memo": (
        b"c__builtin__\nlist\nq\x010h\x01N}X\x01\x00\x00\x00zK\x01s\x86b",
        "BUILD on global __builtin__.list",
    ),
    "bytearray_from_int": (AMPLIFIERS["bytearray_from_int"][0], "bytearray(1500000000)"),
    "tuple_of_range": (AMPLIFIERS["tuple_of_range"][0], "range of 20000000"),
    "encode_hex": (AMPLIFIERS["encode_hex"][0], "_codecs.encode"),
    "reconstruct_shape": (AMPLIFIERS["reconstruct_shape"][0], "_reconstruct"),
    "scalar_itemsize": (AMPLIFIERS["scalar_itemsize"][0], "scalar"),
    "ndarray_call": (AMPLIFIERS["ndarray_call"][0], "numpy.ndarray"),
    "deep": (_deep(10**5), "max_depth=100"),
}


@pytest.mark.parametrize("case", sorted(STRICT_CASES))
def test_inspect_strict_fails_on_what_loading_refuses(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from pickleshard.cli import main

    opcodes, words = STRICT_CASES[case]
    path = _file(tmp_path, opcodes)
    assert main(["inspect", str(path)]) == 0  # without --strict: a report, no failure
    capsys.readouterr()
    assert main(["inspect", "--strict", str(path)]) == 3
    err = capsys.readouterr().err
    assert str(path) in err, err
    assert words in err, err


def test_inspect_strict_audits_nested_torch_payloads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pickleshard.cli import main

    path = _nested_torch_payload(tmp_path)
    assert main(["inspect", "--strict", str(path)]) == 3
    assert "posix.system (dangerous)" in capsys.readouterr().err
    # loading refuses it too: named by the file and sample, without torch's advice to load
    # with weights_only=False
    for mode in ("auto", "whole"):
        err = _refused(tmp_path, path, mode, UnsafePickleError, "posix.system")
        assert "weights_only=False" not in str(err)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_inspect_strict_passes_legit_numpy_and_torch(
    tmp_path: Path, protocol: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from pickleshard.cli import main

    path = tmp_path / "f.pkl"
    values = [np.arange(6.0).reshape(2, 3), np.float32(2), torch.arange(3), {1, 2}, b"ab" * 3000]
    path.write_bytes(pickle.dumps((values, list(range(len(values)))), protocol))
    assert main(["inspect", "--strict", str(path)]) == 0, capsys.readouterr().err


def test_index_format_error_survives_dataloader_reraise() -> None:
    from torch._utils import ExceptionWrapper

    from pickleshard.errors import IndexFormatError

    try:
        raise IndexFormatError("/data/.pickleshard", "starts are not monotonic")
    except PickleshardError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(IndexFormatError, match="not monotonic"):
        wrapped.reraise()
    again = pickle.loads(pickle.dumps(IndexFormatError("one message")))
    assert str(again) == "one message"


def test_whole_file_refusal_names_the_opcode_offset(tmp_path: Path) -> None:
    """Not ``at byte 0`` nor where the unpickler's read-ahead stood: the GLOBAL itself."""
    path = tmp_path / "f.pkl"
    path.write_bytes(pickle.dumps(([np.arange(3)] * 50, [collections.Counter("ab")] * 50), 2))
    with pytest.raises(UnsafePickleError, match=r"collections\.Counter") as info:
        _read_all(tmp_path, "whole")
    data = path.read_bytes()
    offset = info.value.offset
    assert offset is not None
    assert data[offset : offset + 1] == pickle.GLOBAL
    assert data[offset + 1 :].startswith(b"collections\nCounter\n")
