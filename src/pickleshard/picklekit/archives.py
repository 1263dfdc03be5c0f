"""Files that start like a pickle or hold pickles but are not pickle streams of samples:
``torch.save`` archives. Their pickle refers to tensor storages kept beside it (as persistent
ids), which only ``torch.load`` resolves; read as a plain pickle they fail deep inside with
"persistent id instruction", so every reader asks here first and says what the file is."""

from __future__ import annotations

__all__ = ["HEAD_BYTES", "torch_save_kind", "torch_save_message"]

#: how many bytes of a file's start :func:`torch_save_kind` looks at
HEAD_BYTES = 16
_ZIP = b"PK\x03\x04"  # torch.save since torch 1.6 (a zip of data.pkl + one entry per storage)
# the legacy format (_use_new_zipfile_serialization=False): protocol 2, then LONG1 of torch's
# magic number 0x1950a86a20f9469cfc6c, then the protocol version, sys info, the object...
_LEGACY = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


def torch_save_kind(head: bytes) -> str | None:
    """``"zip archive"`` or ``"legacy format"`` when ``head`` (a file's first
    :data:`HEAD_BYTES`) starts a ``torch.save`` file, else None."""
    if head.startswith(_ZIP):
        return "zip archive"
    if head.startswith(_LEGACY):
        return "legacy format"
    return None


def torch_save_message(kind: str) -> str:
    """What a ``torch.save`` file of ``kind`` is and what to do, for a refusal."""
    return (
        f"a torch.save file ({kind}), not a pickle stream of samples: its tensors' storages "
        "are kept beside the pickle, where only torch.load finds them; load it with "
        "torch.load(path, weights_only=True), and write its samples with pickle.dump to read "
        "them here"
    )
