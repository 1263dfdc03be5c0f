"""The audit looks inside torch payloads in every encoding a protocol gives them (issue 26):
protocol 2 writes ``bytes`` as ``_codecs.encode(text, "latin1")``; zip and legacy torch formats."""

from __future__ import annotations

import io
import os
import pickle

import pytest

from pickleshard.safety.audit.files import audit_buffer

torch = pytest.importorskip("torch")


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


class _Sample:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def __reduce__(self) -> tuple[object, tuple[bytes]]:
        return (torch.storage._load_from_bytes, (self.payload,))


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_nested_payload_is_flagged(zipped: bool, protocol: int) -> None:
    buf = io.BytesIO()
    torch.save(_Evil(), buf, _use_new_zipfile_serialization=zipped)
    data = pickle.dumps([_Sample(buf.getvalue())], protocol=protocol)
    verdicts = {g.qualname: g.verdict for g in audit_buffer(data, len(data), "f").globals()}
    assert verdicts[f"{os.system.__module__}.system"] == "dangerous"


def test_plain_encoded_bytes_name_nothing_more() -> None:
    data = pickle.dumps([b"\x80\x02K\x01." * 100], protocol=2)
    names = {g.qualname for g in audit_buffer(data, len(data), "f").globals()}
    assert names == {"_codecs.encode"}
