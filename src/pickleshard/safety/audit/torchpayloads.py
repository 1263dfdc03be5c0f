"""The audit of torch payloads: pickles inside a ``torch.storage._load_from_bytes`` payload."""

from __future__ import annotations

import io
import sys
import zipfile

from ...errors import PickleshardError
from ..allowlist import classify_global
from .model import Audit
from .walk import Blob, GlobalKey, Walk, walk_record

__all__ = ["audit_nested"]

_NESTED_DEPTH = 4  # torch payloads inside torch payloads: audited this deep


def audit_nested(w: Walk, pos: int, blob: Blob) -> None:
    """Audit the pickles inside a ``torch.storage._load_from_bytes`` payload (a torch zip, or
    the legacy format: pickles followed by raw storage bytes), counting their globals as this
    file's, named as found inside it (``posix.system`` in a nested payload is dangerous here)."""
    outer = w.a
    if outer.path.count("[torch payload") >= _NESTED_DEPTH:
        return
    data = blob.data if blob.data is not None else bytes(w.buf[blob.start : blob.start + blob.n])
    members: list[tuple[str, bytes]] = []
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for info in z.infolist():
                    if info.filename.endswith(".pkl") and info.file_size <= 64 << 20:
                        members.append((info.filename, z.read(info)))
        except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError):
            return
    else:
        members.append(("", data))
    for member, body in members:
        name = f"{outer.path}[torch payload at byte {pos}]{'/' + member if member else ''}"
        inner = Audit(name, len(body), bytes_read=len(body))
        at = 0
        while at < len(body):  # legacy: pickles, then raw storage bytes the walk stops at
            iw = Walk(inner, body, len(body), nested=audit_nested)
            try:
                at = walk_record(iw, at)
            except PickleshardError:
                break
            inner.records.append((at, at))
        outer.nested.append((pos, member, inner))
        torch_allows = _torch_weights_only_globals()
        for key, n in inner.refs.items():
            if _torch_admits(key, torch_allows):
                continue  # torch's weights_only loader, which reads the payload, admits it
            outer.refs[key] = outer.refs.get(key, 0) + n
            outer.first_refs.setdefault(key, pos)
            if key in inner.calls:
                outer.calls[key] = outer.calls.get(key, 0) + inner.calls[key]
        outer.builds_on_globals.extend((pos, key) for _, key in inner.builds_on_globals)


def _torch_weights_only_globals() -> frozenset[str] | None:
    """The globals ``torch.load(weights_only=True)`` admits (what reads a nested payload),
    when torch is imported already; None otherwise (the audit never imports it), and then
    :func:`_torch_admits` guesses by name."""
    wo = sys.modules.get("torch._weights_only_unpickler")
    serialization = sys.modules.get("torch.serialization")
    if wo is None or serialization is None:
        return None
    names = set(wo._get_allowed_globals())
    for g in serialization.get_safe_globals():
        obj = g[0] if isinstance(g, tuple) else g
        names.add(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}")
    return frozenset(names)


def _torch_admits(key: GlobalKey, names: frozenset[str] | None) -> bool:
    """Whether torch's weights_only loader admits global ``key`` in a nested payload: by its
    own list when torch is imported, else by the shapes of what ``torch.save`` writes (the
    allowlist's own globals, storage classes, dtypes such as ``torch.float32``)."""
    if classify_global(*key) == "dangerous":
        return False
    if names is not None:
        return ".".join(key) in names
    module, name = key
    return (
        classify_global(module, name) == "allowed"
        or (module.split(".")[0] == "torch" and name.endswith("Storage"))
        or (module == "torch" and name.isidentifier() and name[:1].islower())
    )
