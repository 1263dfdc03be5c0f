"""``FormatTests``: the tests every output format passes; a format's test file subclasses it.

Each test writes a small source dataset with ``pickle.dump``, converts it with
:func:`pickleshard.pipelines.convert.run`, and compares what :func:`pickleshard.formats.open_dataset` returns
with ``pickle.load`` of the source files (:func:`~pickleshard.testing.oracle.oracle_samples`),
exactly: types, dtypes, shapes and bits. Class attributes adapt the kit to a format.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from ..errors import (
    OutputExistsError,
    OutputPathError,
    UnencodableValueError,
    UnsafePickleError,
    VerifyMismatchError,
)
from ..formats import ConvertedDataset, Format, get_format, open_dataset
from ..pipelines.convert.run import ConvertReport, convert
from ..pipelines.verify.run import verify
from .oracle import GATED_GLOBAL, GatedInt, assert_same, oracle_samples, write_files

__all__ = ["DTYPES", "FormatTests", "Unpicklable", "WritesUnpicklable"]

DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128", "datetime64[ns]",
    "datetime64[D]", "timedelta64[s]", "<U5", "S4", ">f4",
)  # fmt: skip
STRUCTURED = np.dtype([("a", "<i4"), ("b", "<f8", (2,)), ("c", "S3")])

# The format travels as a pickled instance, with the parent's sys.path: unpickling it imports the
# module that defines (and registers) it, so a third-party format resumes like a built-in one.
_KILL_SCRIPT = """
import pickle, sys
path, kwargs = pickle.loads(bytes.fromhex(sys.argv[3]))
sys.path[:0] = path
from pickleshard.pipelines.convert.run import convert
convert(sys.argv[1], sys.argv[2], **pickle.loads(kwargs))
"""


class Unpicklable:
    """A value that loads from a pickle (as what :class:`WritesUnpicklable` writes) but that
    pickle refuses to write again: the one kind of value no format can store."""

    def __reduce__(self) -> Any:
        raise TypeError("Unpicklable refuses to be pickled")


class WritesUnpicklable:
    """Pickles as an :class:`Unpicklable`: put it in a source file to test the refusal."""

    def __reduce__(self) -> Any:
        return (Unpicklable, ())


def _arrays(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> list[Any]:
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _typed(rng: np.random.Generator, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    arr = raw.view(dtype).reshape(shape).copy()
    if (
        dtype.kind in "fc"
    ):  # random bits include NaNs of many payloads: keep them, they must survive
        return arr
    if dtype.kind == "U":
        return (
            np.array(["ab", "ÿé", "", "xyz12", "q", "r"][: int(np.prod(shape))])
            .astype(dtype)
            .reshape(shape)
        )
    return arr


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {
        os.path.relpath(p, root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _parts_done(manifest: Path) -> int:
    """How many parts a conversion's manifest records as done (0 before it is written)."""
    try:
        return len(json.loads(manifest.read_text())["done"])
    except FileNotFoundError:
        return 0


class FormatTests:
    """Subclass with ``format = "<name>"`` (a registered format's name, see
    :func:`pickleshard.formats.register_format`); override :meth:`make_format` for format
    options. A third-party format registers itself where its module is imported: the kill test
    reruns the conversion in a new process, which finds the format by importing that module."""

    format: ClassVar[str] = ""
    #: dtype names (``np.dtype(...).str``) the format cannot store; the kit skips them
    unsupported_dtypes: ClassVar[frozenset[str]] = frozenset()
    #: extra keyword arguments for every :func:`pickleshard.pipelines.convert.run` call
    convert_kwargs: ClassVar[dict[str, Any]] = {}
    #: how DataLoader workers start for this format (None: the platform's default, fork on
    #: Linux; "spawn" for a library that is not fork-safe)
    worker_start: ClassVar[str | None] = None

    def make_format(self) -> str | Format:
        return self.format

    def convert(self, src: Path, out: Path, **kwargs: Any) -> ConvertReport:
        return convert(src, out, to=self.make_format(), **{**self.convert_kwargs, **kwargs})

    def open(self, out: Path) -> ConvertedDataset:
        return open_dataset(out, shuffle=False)

    def output_contents(self, out: Path) -> Any:
        """What two runs of one conversion must agree on: every file's bytes. A format whose
        library names files at random or stamps times (Lance) compares what it can instead."""
        return tree_bytes(out)

    def round_trip(self, tmp_path: Path, objects: list[Any], **kwargs: Any) -> ConvertedDataset:
        """Write ``objects`` as pickle files, convert, and compare every sample with the oracle."""
        paths = write_files(tmp_path / "src", objects, protocol=kwargs.pop("protocol", 5))
        self.convert(tmp_path / "src", tmp_path / "out", **kwargs)
        ds = self.open(tmp_path / "out")
        want = oracle_samples(paths)
        assert len(ds) == len(want)
        for i, sample in enumerate(want):
            assert_same(ds[i], sample, f"sample {i}")
        return ds

    # ---- contents ----------------------------------------------------------------------------

    @pytest.mark.parametrize("protocol", [2, 5])
    def test_round_trip_arrays_and_labels(self, tmp_path: Path, protocol: int) -> None:
        rng = np.random.default_rng(0)
        objects = [(_arrays(rng, n, (3, 4)), rng.integers(0, 10, n).tolist()) for n in (5, 7, 3)]
        self.round_trip(tmp_path, objects, jobs=1, protocol=protocol)

    def test_getitems_matches_the_oracle(self, tmp_path: Path) -> None:
        rng = np.random.default_rng(1)
        objects = [(_arrays(rng, 6, (2, 2)), list(range(k * 6, k * 6 + 6))) for k in range(2)]
        ds = self.round_trip(tmp_path, objects)
        want = oracle_samples(sorted((tmp_path / "src").glob("*.pkl")))
        indices = [4, 0, -1, 4, 11, 2]
        for got, i in zip(ds.__getitems__(indices), indices, strict=True):
            assert_same(got, want[i], f"sample {i}")
        assert ds.__getitems__([]) == []
        with pytest.raises(IndexError):
            ds[len(ds)]
        with pytest.raises(IndexError):
            ds.__getitems__([0, len(ds)])

    def test_empty_dataset(self, tmp_path: Path) -> None:
        ds = self.round_trip(tmp_path, [([], [])])
        assert len(ds) == 0
        assert ds.__getitems__([]) == []
        with pytest.raises(IndexError):
            ds[0]

    def test_one_sample(self, tmp_path: Path) -> None:
        ds = self.round_trip(tmp_path, [([np.arange(6, dtype=np.int16).reshape(2, 3)], [7])])
        assert len(ds) == 1

    def test_variable_shapes(self, tmp_path: Path) -> None:
        rng = np.random.default_rng(2)
        ragged = [rng.standard_normal((n, 3)) for n in (2, 5, 0, 1)]
        mixed_ndim = [np.zeros((2,)), np.ones((2, 2)), np.float64(3.0), np.arange(3)]
        per_file = [(_arrays(rng, 3, (2, 2)), [0, 1, 2]), (_arrays(rng, 2, (3, 3)), [3, 4])]
        self.round_trip(tmp_path / "a", [(ragged, mixed_ndim)])
        self.round_trip(tmp_path / "b", per_file, jobs=2)

    def test_python_objects(self, tmp_path: Path) -> None:
        rows = [
            {"tokens": [1, 2, 3], "text": "héllo", "score": 0.5},
            None,
            (1, "two", 3.0, None),
            b"\x00bytes",
            bytearray(b"ba"),
            {1: "int key", (2, 3): [np.arange(3)]},
            OrderedDict(a=1),
            {1, 2, 3},
            frozenset({"x"}),
            2**70,
            float("nan"),
            complex(1, -2),
            True,
            "plain",
            [np.float32(1.5), np.arange(4, dtype=np.uint8).reshape(2, 2)],
            np.array([1, "a", None], dtype=object),
        ]
        labels = [k if k % 3 else str(k) for k in range(len(rows))]
        self.round_trip(tmp_path, [(rows[:7], labels[:7]), (rows[7:], labels[7:])], jobs=2)

    def test_huge_ints_round_trip_exactly(self, tmp_path: Path) -> None:
        # decimal text of a 2 MB int exceeds int()'s 4300-digit limit: it must be stored as bytes
        huge = (1 << (8 * 2_000_000)) - 12345
        values = [huge, -huge, 7, 1 << 64, [huge, 1], {"k": -huge}, 10**700]
        self.round_trip(tmp_path, [(list(range(len(values))), values)], jobs=1)

    def test_every_dtype(self, tmp_path: Path) -> None:
        rng = np.random.default_rng(3)
        names = [d for d in DTYPES if np.dtype(d).str not in self.unsupported_dtypes]
        if STRUCTURED.str not in self.unsupported_dtypes:
            names.append("structured")
        dtypes = {n: STRUCTURED if n == "structured" else np.dtype(n) for n in names}
        arrays = {n: [_typed(rng, dt, (2, 3)) for _ in range(3)] for n, dt in dtypes.items()}
        scalars = {
            f"{n}_scalar": [_typed(rng, dt, (1,))[0] for _ in range(3)] for n, dt in dtypes.items()
        }
        zero_d = {"zero_d": [np.array(1.5), np.array(2.5), np.array(-1.0)]}
        self.round_trip(
            tmp_path, [{**arrays, **scalars, **zero_d}, {**arrays, **scalars, **zero_d}]
        )

    def test_torch_tensors(self, tmp_path: Path) -> None:
        torch = pytest.importorskip("torch")
        xs = [
            torch.arange(6, dtype=torch.float32).reshape(2, 3),
            torch.ones(2, dtype=torch.bfloat16),
        ]
        self.round_trip(tmp_path, [(xs, [torch.tensor(3), torch.zeros(0, dtype=torch.int64)])])

    # ---- errors ------------------------------------------------------------------------------

    def test_other_objects_are_pickled_and_load_under_the_policy(self, tmp_path: Path) -> None:
        write_files(tmp_path / "src", [([1, 2], [Fraction(1, 3), Fraction(2, 3)])])
        self.convert(tmp_path / "src", tmp_path / "out", allow_globals=["fractions.Fraction"])
        with pytest.raises(UnsafePickleError, match=r"fractions\.Fraction"):
            self.open(tmp_path / "out")[0]
        ds = open_dataset(tmp_path / "out", shuffle=False, allow_globals=["fractions.Fraction"])
        assert_same(ds[1], (2, Fraction(2, 3)))
        assert_same(
            open_dataset(tmp_path / "out", shuffle=False, trusted=True)[0][1], Fraction(1, 3)
        )

    def test_unencodable_value_names_file_sample_and_field(self, tmp_path: Path) -> None:
        write_files(tmp_path / "src", [([1, 2, 3], [0, WritesUnpicklable(), 2])])
        with pytest.raises(UnencodableValueError) as info:
            self.convert(tmp_path / "src", tmp_path / "out", trusted=True)
        assert info.value.sample == 1
        assert "part-000.pkl" in str(info.value)
        assert "'y'" in str(info.value)
        assert not (tmp_path / "out").exists()

    def test_unwritable_output_path(self, tmp_path: Path) -> None:
        write_files(tmp_path / "src", [([1, 2], [3, 4])])
        blocker = tmp_path / "a-file"
        blocker.write_text("not a directory")
        with pytest.raises(OutputPathError) as info:
            self.convert(tmp_path / "src", blocker / "out")
        assert str(blocker / "out") in str(info.value)
        assert isinstance(info.value, OSError)

    def test_rerun_is_a_no_op_and_other_outputs_are_refused(self, tmp_path: Path) -> None:
        write_files(tmp_path / "src", [([1, 2], [3, 4])])
        write_files(tmp_path / "other", [([5], [6])])
        first = self.convert(tmp_path / "src", tmp_path / "out")
        assert not first.already_done
        assert self.convert(tmp_path / "src", tmp_path / "out").already_done
        with pytest.raises(OutputExistsError):
            self.convert(tmp_path / "other", tmp_path / "out")
        self.convert(tmp_path / "other", tmp_path / "out", overwrite=True)
        assert len(self.open(tmp_path / "out")) == 1

    # ---- parallel, resumable, atomic ---------------------------------------------------------

    def test_jobs_do_not_change_the_output(self, tmp_path: Path) -> None:
        rng = np.random.default_rng(4)
        write_files(tmp_path / "src", [(_arrays(rng, 5, (2,)), [1] * 5) for _ in range(4)])
        self.convert(tmp_path / "src", tmp_path / "one", jobs=1)
        self.convert(tmp_path / "src", tmp_path / "two", jobs=2)
        assert self.output_contents(tmp_path / "one") == self.output_contents(tmp_path / "two")

    @pytest.mark.slow
    def test_kill_and_resume_gives_the_uninterrupted_output(self, tmp_path: Path) -> None:
        rng = np.random.default_rng(5)
        src, out, gate = tmp_path / "src", tmp_path / "out", tmp_path / "gate"
        # files 2-5 unpickle only once the gate exists: the killed run finishes parts 0 and 1,
        # then waits there however slow the machine is, until the test has killed it
        ys = [[GatedInt(f, gate) if f >= 2 else f, 1, 2, 3] for f in range(6)]
        write_files(src, [(_arrays(rng, 4, (2, 3)), y) for y in ys])
        kwargs: dict[str, Any] = {**self.convert_kwargs, "jobs": 2, "allow_globals": [GATED_GLOBAL]}
        gate.touch()
        self.convert(src, tmp_path / "reference", **kwargs)  # also indexes src: no decoding later
        gate.unlink()
        job = pickle.dumps({"to": get_format(self.make_format()), **kwargs})
        args = pickle.dumps((sys.path, job)).hex()
        proc = subprocess.Popen(
            [sys.executable, "-c", _KILL_SCRIPT, str(src), str(out), args],
            start_new_session=True,
        )
        manifest = tmp_path / ".out.partial" / "manifest.json"
        deadline = time.monotonic() + 300  # a failure's bound only: the wait ends on the event
        try:
            while not _parts_done(manifest) >= 2:
                assert proc.poll() is None, "the conversion ended before it could be killed"
                assert time.monotonic() < deadline, "parts 0 and 1 were not done in 300 s"
                time.sleep(0.02)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL, "the conversion ended before it could be killed"
        assert not out.exists(), "a killed conversion left a partial output"
        gate.touch()
        report = self.convert(src, out, **kwargs)
        assert 2 <= report.parts_reused < report.parts
        assert self.output_contents(out) == self.output_contents(tmp_path / "reference")
        assert not (tmp_path / ".out.partial").exists()

    # ---- verify ------------------------------------------------------------------------------

    def test_verify_catches_a_flipped_byte(self, tmp_path: Path) -> None:
        rng = np.random.default_rng(6)
        paths = write_files(tmp_path / "src", [(_arrays(rng, 8, (4, 4)), list(range(8)))])
        out = tmp_path / "out"
        report = self.convert(tmp_path / "src", out, verify=True)
        assert report.verified == 8
        # Flip one byte of sample 5's x wherever it is stored (LMDB keeps stale page copies).
        needle = oracle_samples(paths)[5][0].tobytes()
        flipped = 0
        for path in sorted(out.rglob("*")):
            if not path.is_file() or path.name in ("hashes.npy", "pickleshard.json", "index.npy"):
                continue
            data = bytearray(path.read_bytes())
            at = data.find(needle)
            while at >= 0:
                data[at + 9] ^= 0xFF
                flipped += 1
                at = data.find(needle, at + 1)
            path.write_bytes(bytes(data))
        assert flipped, "sample 5's bytes are not stored verbatim in any file"
        for source in (tmp_path / "src", None):
            with pytest.raises(VerifyMismatchError) as info:
                verify(source, out)
            assert info.value.sample == 5
            assert str(out) in str(info.value)

    def test_verify_a_seeded_sample(self, tmp_path: Path) -> None:
        write_files(tmp_path / "src", [(list(range(20)), list(range(20)))])
        self.convert(tmp_path / "src", tmp_path / "out")
        report = verify(tmp_path / "src", tmp_path / "out", sample=5, seed=1)
        assert (report.checked, report.total, report.against) == (5, 20, "source")
        assert verify(None, tmp_path / "out").against == "stored hashes"

    # ---- reading -----------------------------------------------------------------------------

    def test_survives_pickling(self, tmp_path: Path) -> None:
        rng = np.random.default_rng(7)
        ds = self.round_trip(tmp_path, [(_arrays(rng, 4, (2,)), [0, 1, 2, 3])])
        back = pickle.loads(pickle.dumps(ds))
        for i in range(len(ds)):
            assert_same(back[i], ds[i], f"sample {i}")

    def test_dataloader_sees_every_sample_once(self, tmp_path: Path) -> None:
        data = pytest.importorskip("torch.utils.data")
        rng = np.random.default_rng(8)
        objects = [(_arrays(rng, 10, (3,)), list(range(k * 10, k * 10 + 10))) for k in range(3)]
        write_files(tmp_path / "src", objects)
        self.convert(tmp_path / "src", tmp_path / "out")
        ds = self.open(tmp_path / "out")
        context = self.worker_start  # how the format's library lets workers start
        if isinstance(ds, data.IterableDataset):
            loader = data.DataLoader(
                ds, batch_size=4, num_workers=2, multiprocessing_context=context
            )
        else:
            loader = data.DataLoader(
                ds, batch_size=4, shuffle=True, num_workers=2, multiprocessing_context=context
            )
        seen = [int(y) for _, ys in loader for y in ys]
        assert sorted(seen) == list(range(30))
