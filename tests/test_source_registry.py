"""The byte-source registry: ``register_source`` refuses to replace a protocol's opener silently,
as ``register_format`` refuses a format's class."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from pickleshard.errors import AlreadyRegisteredError, PickleshardError
from pickleshard.io import base, open_source, register_source, registered_sources
from pickleshard.io.local import LocalFile


class MirrorFile(LocalFile):
    """A local file reached through ``mirror://PATH``: a third-party source of the tests."""

    protocol = "mirror"

    def __init__(self, url: str) -> None:
        super().__init__(url.removeprefix("mirror://"))


@pytest.fixture
def scratch_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sources registered by a test are forgotten after it."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))


def test_a_registered_source_opens_its_urls(tmp_path: Path, scratch_sources: None) -> None:
    path = tmp_path / "a.pkl"
    path.write_bytes(pickle.dumps(([1, 2], [3, 4])))
    register_source("mirror", MirrorFile)
    assert "mirror" in registered_sources()
    with open_source(f"mirror://{path}") as src:
        assert src.read_at(0, src.size) == path.read_bytes()


def test_register_source_refuses_a_silent_replacement(scratch_sources: None) -> None:
    held = base._REGISTRY["file"]
    with pytest.raises(AlreadyRegisteredError) as info:
        register_source("file", MirrorFile)
    message = str(info.value)
    assert "byte source 'file' is already registered as pickleshard.io.local:LocalFile" in message
    assert "clobber=True" in message
    assert isinstance(info.value, (PickleshardError, ValueError))
    assert base._REGISTRY["file"] is held
    register_source("file", held)  # the same opener again: no change, no error
    register_source("mirror", MirrorFile)
    register_source("mirror", MirrorFile)
    register_source("file", MirrorFile, clobber=True)  # on purpose
    assert base._REGISTRY["file"] is MirrorFile


def test_the_builtin_protocols_each_have_one_opener() -> None:
    """Importing the package registered each built-in protocol once, without a clash."""
    assert {"file", "s3", "gs", "http", "https", "memory"} <= set(registered_sources())


def test_the_refusal_survives_pickling() -> None:
    err = AlreadyRegisteredError("byte source", "s3", "some.module:Opener")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is AlreadyRegisteredError
    assert (back.kind, back.name, back.held, str(back)) == (err.kind, err.name, err.held, str(err))
