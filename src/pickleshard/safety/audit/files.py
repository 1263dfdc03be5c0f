"""The globals audit: every global a pickle file names, found by reading opcodes only.

:func:`audit_buffer` walks every pickle of a file (any protocol, 0-5, and several appended one
after another) with the opcode tables of :mod:`pickleshard.picklekit.opcodes`, stepping over payloads. It
keeps a symbolic stack that knows only short strings and global references, so it can name:

- ``GLOBAL`` and ``INST`` (module and name are the opcode's text argument);
- ``STACK_GLOBAL`` (its two string operands, pushed directly or through the memo by ``PUT`` /
  ``MEMOIZE`` and ``GET``: memo ids are tracked exactly as the unpickler assigns them);
- ``EXT1`` / ``EXT2`` / ``EXT4`` (the code is looked up in :mod:`copyreg`'s extension registry as
  data; an unregistered code is named ``copyreg.<extension N>``).

Nothing is imported or called. A ``STACK_GLOBAL`` whose operands are not string constants (they
were computed by a call, or are not strings) cannot be named from the bytes: it is listed as
``?.?`` with verdict "dangerous", since CPython's pickler never writes one. Each global gets its
number of references, the number of ``REDUCE`` / ``NEWOBJ`` / ``NEWOBJ_EX`` / ``OBJ`` / ``INST``
calls made on it, and its :func:`~pickleshard.safety.allowlist.classify_global` verdict.

Structural damage (truncation, unknown opcodes, stack underflow, a ``GET`` of a memo id never
stored) raises the :mod:`pickleshard.errors` classes with the file and offset.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ...errors import CorruptPickleError, EmptyPickleError, NotAPickleError, TruncatedPickleError
from ...picklekit import opcodes as oc
from ...picklekit.archives import HEAD_BYTES, torch_save_kind, torch_save_message
from ...picklekit.gcpause import paused_gc
from .model import Audit, GlobalKey, GlobalUse
from .torchpayloads import audit_nested
from .walk import Walk, walk_record

__all__ = ["Audit", "GlobalUse", "audit_buffer", "locate_global"]

_MAGIC = {
    b"\x93NUM": "a .npy file (open it with numpy.load)",
    b"\x89HDF": "an HDF5 file",
}


_UNFRAMED_OPENERS = frozenset(b"(]})")  # MARK, EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE


def audit_buffer(buf: Any, size: int, name: str) -> Audit:
    """Audit every pickle in ``buf[:size]`` (bytes or an mmap); see the module docstring."""
    if size == 0:
        raise EmptyPickleError(name, "file is empty; expected a pickle stream", offset=0)
    head = bytes(buf[:4])
    torch_save = torch_save_kind(bytes(buf[:HEAD_BYTES]))
    if torch_save is not None:
        raise NotAPickleError(name, torch_save_message(torch_save), offset=0)
    if head in _MAGIC:
        raise NotAPickleError(name, f"{_MAGIC[head]}, not a pickle stream", offset=0)
    if oc.FORM[buf[0]] == oc.F_BAD:
        raise NotAPickleError(name, f"byte 0x{buf[0]:02x} is not a pickle opcode", offset=0)
    audit = Audit(name, size, bytes_read=size)
    pos = 0
    while pos < size:
        if buf[pos] == oc.PROTO_OP and pos + 1 < size and buf[pos + 1] > oc.HIGHEST_PROTOCOL:
            why = f"PROTO opcode names unknown protocol {buf[pos + 1]}"
            raise NotAPickleError(name, why, offset=pos + 1)
        w = Walk(audit, buf, size, nested=audit_nested)
        try:  # the walk makes no cycles; collections over its memo would cost time
            with paused_gc():
                nxt = walk_record(w, pos)
        except CorruptPickleError as exc:
            # as whole-file mode classifies: no PROTO and no protocol 0/1 container opener that
            # ran out of bytes means these bytes were never a pickle
            ran_out = isinstance(exc, TruncatedPickleError)
            if buf[pos] != oc.PROTO_OP and not (ran_out and buf[pos] in _UNFRAMED_OPENERS):
                what = "not a pickle stream" if pos == 0 else f"bytes after pickle ending at {pos}"
                detail = str(exc).removeprefix(f"{name}: ")
                raise NotAPickleError(name, f"{what}: {detail}", offset=pos) from None
            raise
        if not audit.records:
            audit.protocol = w.proto if w.proto >= 0 else min(w.hi, 1)
        audit.records.append((pos, nxt))
        pos = nxt
    return audit


def locate_global(file: Any, start: int, key: GlobalKey | None, qualname: str | None) -> int | None:
    """The offset of the opcode behind a refusal in the pickle starting at ``start`` of ``file``
    (a buffer, an in-memory file, or a reader over a :class:`~pickleshard.io.ByteSource`, such as
    :func:`pickleshard.io.open_reader` gives): the ``BUILD`` on global ``qualname`` when there is
    one, else the first opcode naming ``key``; None when the walk finds neither (or the file is
    none of those). Read from the buffer or the source by range: the file's position is left as
    it is (an unpickler is reading it)."""
    buf: Any
    source = getattr(getattr(file, "raw", file), "source", None)
    if isinstance(file, (bytes, bytearray)):
        buf = file
    elif hasattr(file, "getbuffer"):
        buf = bytes(file.getbuffer())  # the walk needs find(); a refusal is rare
    elif source is not None:
        mapped = source.map()
        buf = mapped if mapped is not None else source.read_at(0, source.size)
    else:
        return None
    size = len(buf)
    audit = Audit("<refusal>", size)
    w = Walk(audit, buf, size, nested=audit_nested)
    # a damaged stream fails the walk too: what it saw before the damage is still where it is
    with contextlib.suppress(CorruptPickleError):
        walk_record(w, start)
    if qualname is not None:
        for pos, target in audit.builds_on_globals:
            if ".".join(target) == qualname:
                return pos
        for table in (audit.first_calls, audit.first_refs):
            for k, pos in table.items():
                if ".".join(k) == qualname:
                    return pos
    return audit.first_refs.get(key) if key is not None else None
