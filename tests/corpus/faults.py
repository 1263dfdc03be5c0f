"""The fault corpus (issue 12): hostile sizes, ``BUILD`` on allowlisted globals, trailing bytes,
special files, a tampered index and a file rewritten during an epoch, generated, not stored.

:func:`fault_cases` yields :class:`~corpus.corpus.Case` records that
:func:`corpus.corpus_run.run_corpus` (``suite="faults"``) runs through every entry
point of :data:`corpus.fault_worker.ENTRY_POINTS`. A case's ``expect`` says what
a correct outcome is: ``"data"`` (legitimate data: the value :func:`pickle.load` gives, or a
package error naming the file) or ``"refuse"`` (an abuse or a file that is no dataset: only a
package error naming the file is right; returning samples, or ``inspect --strict`` passing, is
WRONG). ``setup`` says what the worker makes of the bytes before the entry point runs
(:mod:`corpus.fault_setup`). Families (``Case.family``):

``sizes``
    a few bytes that the allowlist turns into a huge object (``bytearray(1_500_000_000)``,
    ``bytes(10**9)`` by ``REDUCE`` and ``NEWOBJ``, containers of ``range(20_000_000)``, chained
    ``_codecs.encode(..., 'hex')``, numpy reconstruction with a huge shape or void dtype, a
    ``BYTEARRAY8`` claiming 2**62 bytes), a sample nested 10**6 deep (on the stack, and through
    the memo with a stack of two), and a real 2 MB integer (legitimate: ``expect="data"``).
``build``
    ``BUILD`` applied to an allowlisted global (torch's ``_rebuild_tensor_v2`` and numpy's
    ``_frombuffer``: their ``__defaults__`` rewritten through a slot state), directly and
    through the memo; and a ``torch.storage._load_from_bytes`` payload whose nested pickle
    runs ``posix.system`` (the canary). The worker also checks that these globals are intact
    after the entry point ran.
``trailing``
    a valid dataset pickle followed by garbage or zeros.
``special``
    ``data.pkl`` made a FIFO, or a symlink to ``/dev/zero``.
``tamper``
    a valid two-file dataset whose ``.pickleshard/`` index the worker edits after building it.
``rewrite``
    one file of 12 KB float32 arrays rewritten in place (same size, new values) by a thread
    while a shuffled epoch reads it: each sample must be the old or the new value.
"""

from __future__ import annotations

import codecs
import pickle
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from .corpus import Case

__all__ = ["REWRITE_NEW", "TAMPER_KINDS", "fault_cases", "rewrite_versions", "tamper_dataset"]

# the names of extra files of a case, beside its data file (never a pickle suffix: not indexed)
REWRITE_NEW = "new.bin"
TAMPER_KINDS = (
    "item_dtype_object",
    "item_shape_huge",
    "starts_dtype_object",
    "starts_float64",
    "start_negative",
    "starts_past_eof",
    "rows_swapped",
    "counts_moved",
    "npy_truncated",
    "file_path_escape",
    "array_path_escape",
    "shape_edited_with_stat",
)
DEEP = 10**6
_P8 = struct.Struct("<Q").pack
_P4 = struct.Struct("<I").pack


class _Reduce:
    """Pickles as ``func(*args)`` (``REDUCE``)."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


def _in_layout(evil: Any, protocol: int = 4) -> bytes:
    """A two-sample ``(x, y)`` columns layout whose first ``x`` element is ``evil``."""
    return pickle.dumps(([evil, b"fine"], [0, 1]), protocol)


def _ops_in_layout(ops: bytes) -> bytes:
    """``([v, 1], [0, 1])`` where ``v`` is what the opcodes ``ops`` push."""
    return b"\x80\x02](" + ops + b"K\x01e](K\x00K\x01e\x86."


def _codecs_chain(steps: int) -> Any:
    value: Any = b"x"
    for _ in range(steps):
        value = _Reduce(codecs.encode, value, "hex")
    return value


def _deep_stack(n: int) -> bytes:
    """``([deep, 1], [0, 1])``, ``deep`` nested ``n`` lists, built on an ``n``-deep stack."""
    return b"\x80\x04](" + b"]" * n + b"a" * (n - 1) + b"K\x01e](K\x00K\x01e\x86."


def _deep_memo(n: int) -> bytes:
    """The same value built through the memo with a stack of two: ``L_k = [L_{k-1}]``, each
    list stored at memo id ``k``, and ``POP``-ped until the last is fetched."""
    body = [b"\x80\x04]r" + _P4(0) + b"0"]
    for k in range(1, n):
        body.append(b"]r" + _P4(k) + b"j" + _P4(k - 1) + b"a0")
    head = b"](j" + _P4(n - 1) + b"K\x01e](K\x00K\x01e\x86."
    return b"".join(body) + head


def _sizes() -> Iterator[tuple[str, bytes, str]]:
    core = np._core.multiarray  # type: ignore[attr-defined]  # the path numpy 2 pickles write
    yield "bytearray_int", _in_layout(_Reduce(bytearray, 1_500_000_000)), "refuse"
    yield "bytes_int_reduce", _in_layout(_Reduce(bytes, 10**9)), "refuse"
    newobj = b"cbuiltins\nbytes\nJ" + _P4(10**9) + b"\x85\x81"  # bytes.__new__(bytes, 10**9)
    yield "bytes_int_newobj", _ops_in_layout(newobj), "refuse"
    for kind in (tuple, list, set, frozenset):
        yield f"{kind.__name__}_range", _in_layout(_Reduce(kind, range(20_000_000))), "refuse"
    yield "codecs_hex_chain", _in_layout(_codecs_chain(30)), "refuse"
    yield (
        "numpy_reconstruct_shape",
        _in_layout(_Reduce(core._reconstruct, np.ndarray, (1_500_000_000,), b"b")),
        "refuse",
    )
    yield (
        "numpy_scalar_void",
        _in_layout(_Reduce(core.scalar, np.dtype("V1500000000"), b"")),
        "refuse",
    )
    yield "numpy_ndarray_direct", _in_layout(_Reduce(np.ndarray, (10**10,))), "refuse"
    arr = pickle.dumps(([np.zeros(4, np.float32), np.ones(4, np.float32)], [1, 2]), 5)
    at = arr.index(b"\x96")
    yield "bytearray8_huge", arr[: at + 1] + _P8(2**62) + arr[at + 9 :], "refuse"
    yield "deep_stack", _deep_stack(DEEP), "refuse"
    yield "deep_memo", _deep_memo(DEEP), "refuse"
    big = (1 << (16 * 10**6)) - 12345  # 2 MB of digits in LONG4: legitimate data
    yield "int_2mb", pickle.dumps(([big, -big], [0, 1]), 4), "data"


def _build_on_global(module: str, name: str, state: Any, memo: bool) -> bytes:
    """``([f, 1], [0, 1])`` where ``f`` is global ``module.name`` after ``BUILD`` with
    ``(None, state)`` (a slot state: ``setattr`` on the global); with ``memo`` the global is
    stored, popped, and fetched back from the memo before the ``BUILD``."""
    glob = b"c" + module.encode() + b"\n" + name.encode() + b"\n"
    state_ops = pickle.dumps((None, state), 2)[2:-1]  # without PROTO and STOP
    # memo ids of state_ops start at 0: the global goes to id 100, which they never reach
    target = glob + b"r" + _P4(100) + b"0" + b"j" + _P4(100) if memo else glob
    return _ops_in_layout(target + state_ops + b"b")


def _build() -> Iterator[tuple[str, bytes, str]]:
    torch_state = {"__defaults__": ({"neg": True},)}
    numpy_state = {"__defaults__": ((2, 1, 0),)}
    for memo in (False, True):
        how = "memo" if memo else "direct"
        yield (
            f"torch_rebuild_defaults_{how}",
            _build_on_global("torch._utils", "_rebuild_tensor_v2", torch_state, memo),
            "refuse",
        )
        yield (
            f"numpy_frombuffer_defaults_{how}",
            _build_on_global("numpy._core.numeric", "_frombuffer", numpy_state, memo),
            "refuse",
        )


def _nested_torch(canary: str) -> bytes:
    import posix

    import torch.storage

    inner = pickle.dumps(_Reduce(posix.system, f"touch {canary}"), 2)
    return _in_layout(_Reduce(torch.storage._load_from_bytes, inner))


def _good_layout(n: int = 4, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(n)]
    return pickle.dumps((xs, list(range(n))), 4)


def rewrite_versions(n: int = 48) -> tuple[bytes, bytes]:
    """Two pickles of ``(x, y)``, ``n`` 12 KB float32 arrays each, same size, other values."""
    out = []
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        xs = [rng.standard_normal(3072).astype(np.float32) for _ in range(n)]
        out.append(pickle.dumps((xs, [seed * 1000 + i for i in range(n)]), 4))
    if len(out[0]) != len(out[1]):
        raise AssertionError("the two versions of the rewritten file differ in size")
    return out[0], out[1]


def tamper_dataset() -> tuple[bytes, bytes]:
    """The two files of the dataset whose index the tamper cases edit."""
    return _good_layout(6, 3), _good_layout(4, 4)


def fault_cases(canary: str) -> list[Case]:
    """The whole fault corpus; ``canary`` is the path the code-running payloads try to create."""
    cases = [Case(f"sizes_{n}", "sizes", d, expect=e) for n, d, e in _sizes()]
    cases += [Case(f"build_{n}", "build", d, expect=e) for n, d, e in _build()]
    cases.append(Case("build_torch_nested_system", "build", _nested_torch(canary), expect="refuse"))
    good = _good_layout()
    cases.append(Case("trailing_garbage", "trailing", good + b"garbage\xff\x00!", expect="refuse"))
    cases.append(Case("trailing_zeros", "trailing", good + bytes(4096), expect="refuse"))
    cases.append(Case("special_fifo", "special", b"", setup="fifo", expect="refuse"))
    cases.append(Case("special_dev_zero", "special", b"", setup="symlink_zero", expect="refuse"))
    first, second = tamper_dataset()
    for kind in TAMPER_KINDS:
        extra = (("b.pkl", second),)
        cases.append(Case(f"tamper_{kind}", "tamper", first, setup=f"tamper:{kind}", extra=extra))
    old, new = rewrite_versions()
    extra = ((REWRITE_NEW, new),)
    cases.append(Case("rewrite_during_epoch", "rewrite", old, setup="rewrite", extra=extra))
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise AssertionError("fault case names are not unique")
    return cases
