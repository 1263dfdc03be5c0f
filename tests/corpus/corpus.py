"""The bad-input corpus: thousands of damaged, hostile or foreign files, generated, not stored.

:func:`generate` yields :class:`Case` records, each the bytes of one file to be saved under a
``.pkl`` / ``.pickle`` name and read by every entry point of pickleshard. Families (``Case.family``):

``truncated``
    every small valid file of :func:`valid_files` (all layouts, protocols 0-5) cut at every
    opcode boundary (``pickletools.genops`` offsets, over every appended pickle).
``bitflip``
    the same files with one to three bits flipped (seeded: the corpus is the same on every run).
``reencoded``
    the valid files with opcodes swapped for equivalent ones (``BINUNICODE8`` for
    ``SHORT_BINUNICODE``, ``LONG_BINPUT`` for ``MEMOIZE``, ``LONG1`` for ``BININT1``...), unframed:
    valid pickles the scanner has never seen from CPython's pickler.
``length``
    payload lengths that lie: ``BINBYTES8`` / ``BINUNICODE8`` / ``BYTEARRAY8`` claiming 2**62
    bytes, ``BINSTRING`` negative, ``LONG_BINPUT`` ids near 2**32, ``FRAME`` lengths past the end.
``frames``
    valid layouts re-framed: frames cutting opcodes, one per opcode, empty, nested, lengths off.
``deep``
    100,000 nested lists, tuples and MARKs, balanced or not.
``stack``
    ``GET`` of undefined memo ids, unbalanced ``MARK``, ``POP`` on an empty stack, unknown opcodes.
``hostile``
    valid pickles whose ``REDUCE`` / ``INST`` / ``OBJ`` would run ``os.system`` and friends,
    creating the file ``canary`` (see :func:`hostile`): it must never exist.
``foreign``
    empty, text, JSON, zip, gzip, ``.npy``, PNG/ELF headers and binary noise.

Nothing here unpickles anything: :mod:`corpus.corpus_run` does, in a subprocess
under memory and CPU limits.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import pickletools
import random
import subprocess
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .corpus_streams import columns, deep, frames, lengths, reencode, stack

__all__ = ["Case", "generate", "hostile", "opcode_offsets", "valid_files"]

FLIPS_PER_FILE = 24


@dataclass(frozen=True)
class Case:
    """One corpus file: ``name`` (unique, file-name safe), ``family`` and the bytes.

    ``original`` (truncated and bit-flipped cases) is the valid file they were made from: the
    runner also scans it and reads its spans from ``data``, as for a file changed after indexing.
    The fault corpus (:mod:`corpus.faults`) also sets ``expect`` (``"data"``: the
    value of ``pickle.load`` or a package error is right; ``"refuse"``: only an error is),
    ``setup`` (what the worker makes of the bytes first: a FIFO, a tampered index...) and
    ``extra`` (more files of the case, ``(name, bytes)``).
    """

    name: str
    family: str
    data: bytes
    suffix: str = ".pkl"
    original: bytes | None = None
    expect: str = "data"
    setup: str = ""
    extra: tuple[tuple[str, bytes], ...] = ()


def _layouts() -> Iterator[tuple[str, list[Any]]]:
    """(layout, objects to pickle one after another) for every layout the scanner knows."""
    c = columns()
    x, y, tag, obj = c["x"], c["y"], c["tag"], c["obj"]
    n = len(x)
    stacked = np.arange(n * 2, dtype=np.int16).reshape(n, 2)
    yield "columns", [(x, y, tag, stacked)]
    yield "columns_list", [[x, y]]
    yield "dict_columns", [{"x": x, "y": y, "rows": stacked}]
    yield "rows", [[(x[i], y[i], obj[i]) for i in range(n)]]
    yield "dict_rows", [[{"x": x[i], "tag": tag[i]} for i in range(n)]]
    yield "appended_samples", [(x[i], y[i]) for i in range(n)]
    yield "appended_columns", [(x[:1], y[:1]), (x[1:], y[1:])]


def valid_files() -> Iterator[tuple[str, bytes]]:
    """Small valid pickle files: every layout at every protocol 0-5, as ``(label, bytes)``."""
    for layout, objs in _layouts():
        for protocol in range(6):
            yield f"{layout}_p{protocol}", b"".join(pickle.dumps(o, protocol) for o in objs)


def opcode_offsets(data: bytes) -> list[int]:
    """Offset of every opcode of every pickle in ``data`` (pickles appended one after another)."""
    out: list[int] = []
    base = 0
    while base < len(data):
        stream = io.BytesIO(data[base:])
        out.extend(base + (pos or 0) for _, _, pos in pickletools.genops(stream))
        base += stream.tell()
    return out


def _truncated(label: str, data: bytes) -> Iterator[Case]:
    for cut in opcode_offsets(data):
        if cut:
            yield Case(f"trunc_{label}_at{cut}", "truncated", data[:cut], original=data)


def _flipped(label: str, data: bytes, rng: random.Random) -> Iterator[Case]:
    for k in range(FLIPS_PER_FILE):
        buf = bytearray(data)
        where = []
        for _ in range(1 if k < FLIPS_PER_FILE // 2 else rng.randint(2, 3)):
            pos, bit = rng.randrange(len(buf)), rng.randrange(8)
            buf[pos] ^= 1 << bit
            where.append(f"{pos}b{bit}")
        yield Case(f"flip_{label}_{'_'.join(where)}", "bitflip", bytes(buf), original=data)


class _Reduce:
    """Pickles as ``func(*args)``."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


def hostile(canary: str) -> Iterator[tuple[str, bytes]]:
    """Valid pickles that would create the file ``canary`` when unpickled without restriction."""
    cmd = f"touch {canary}"
    code = f"open({canary!r}, 'w').close()"
    calls = {
        "os_system": _Reduce(os.system, cmd),
        "subprocess_call": _Reduce(subprocess.call, ["touch", canary]),
        "eval": _Reduce(eval, code),
        "exec": _Reduce(exec, code),
        "open": _Reduce(open, canary, "w"),
    }
    for kind, evil in calls.items():
        for protocol in range(6):
            yield f"{kind}_p{protocol}_top", pickle.dumps(evil, protocol)
            yield f"{kind}_p{protocol}_in_x", pickle.dumps(([1, evil], [0, 1]), protocol)
            yield f"{kind}_p{protocol}_in_rows", pickle.dumps([(1, 0), (evil, 1)], protocol)
            yield (
                f"{kind}_p{protocol}_appended",
                (pickle.dumps((1, 0), protocol) + pickle.dumps((evil, 1), protocol)),
            )
            yield f"{kind}_p{protocol}_dict_key", pickle.dumps({"x": [1], evil: [2]}, protocol)
    quoted = cmd.encode()
    yield "inst_p0", b"(S'" + quoted + b"'\nios\nsystem\n."
    yield "obj_p1", b"(cos\nsystem\nS'" + quoted + b"'\no."
    yield "global_posix_p0", b"cposix\nsystem\n(S'" + quoted + b"'\ntR."
    yield (
        "stack_global_p4",
        (b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c" + bytes([len(quoted)]) + quoted + b"\x85R."),
    )
    # BUILD on an allowlisted class with a dict state must not reach a dangerous __setstate__
    yield "build_state", b"\x80\x02cbuiltins\nlist\n)Rcos\nsystem\nb."


def _foreign() -> Iterator[tuple[str, bytes, str]]:
    yield "empty", b"", ".pkl"
    yield "empty_pickle_suffix", b"", ".pickle"
    yield "text", b"hello world\nthis is a text file, not a pickle\n", ".pkl"
    yield "csv", b"x,y\n1.5,2\n3.5,4\n", ".pickle"
    yield "json", b'{"x": [1, 2], "y": [3, 4]}', ".pkl"
    yield "newline", b"\n", ".pkl"
    yield "dot", b".", ".pkl"
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w") as zf:
        member = zipfile.ZipInfo("archive/data.pkl", date_time=(2020, 1, 1, 0, 0, 0))
        zf.writestr(member, pickle.dumps(([1, 2], [3, 4]), 2))
    yield "zip_torch_like", zbuf.getvalue(), ".pkl"
    yield "gzip_pickle", gzip.compress(pickle.dumps(([1, 2], [3, 4]), 4), mtime=0), ".pickle"
    nbuf = io.BytesIO()
    np.save(nbuf, np.arange(10))
    yield "npy", nbuf.getvalue(), ".pkl"
    yield "png_header", b"\x89PNG\r\n\x1a\n" + bytes(64), ".pkl"
    yield "elf_header", b"\x7fELF\x02\x01\x01" + bytes(64), ".pickle"
    yield "utf16_bom", "(lp0\n.".encode("utf-16"), ".pkl"
    rng = np.random.default_rng(4)
    for k in range(12):
        noise = rng.integers(0, 256, size=int(rng.integers(1, 4096)), dtype=np.uint8).tobytes()
        yield f"noise_{k}", noise, ".pkl"
        yield f"noise_after_proto5_{k}", b"\x80\x05" + noise, ".pkl"
        yield f"noise_after_proto2_{k}", b"\x80\x02" + noise, ".pickle"


def generate(canary: str, *, seed: int = 2026) -> list[Case]:
    """The whole corpus; ``canary`` is the path the hostile cases try to create."""
    rng, swaps = random.Random(seed), random.Random(seed + 1)
    cases: list[Case] = []
    for label, data in valid_files():
        cases.append(Case(f"valid_{label}", "valid", data))
        cases += _truncated(label, data)
        cases += _flipped(label, data, rng)
        cases += [
            Case(f"reencoded_{label}_{k}", "reencoded", reencode(data, swaps)) for k in range(4)
        ]
    families = (
        ("length", lengths()),
        ("frames", frames()),
        ("deep", deep()),
        ("stack", stack()),
    )
    for family, items in families:
        cases += [Case(f"{family}_{name}", family, data) for name, data in items]
    cases += [Case(f"hostile_{name}", "hostile", data) for name, data in hostile(canary)]
    cases += [Case(f"foreign_{n}", "foreign", data, suffix) for n, data, suffix in _foreign()]
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise AssertionError("corpus case names are not unique")
    return cases
