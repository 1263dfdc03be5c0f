"""The staging directory of a conversion in progress: manifest, parts, lock, and the final rename.

``.<OUT name>.partial/`` next to ``OUT`` holds::

    manifest.json      {"format": "pickleshard-convert-manifest", "version": 1,
                        "identity": {source files, output options}, "parts": [[id, start, stop,
                        first_file, end_file], ...], "done": {"<id>": <part summary>, ...}}
    parts/part-<id>/   a finished part (a part is written as part-<id>.tmp-<pid> and renamed)
    .lock              flock'ed by the running conversion
    ...                the final files, once finalizing has begun; pickleshard.json last.
                       Finalizing starts by deleting whatever an interrupted finalize left here;
                       it never changes parts/, so it can always start again.

Only the coordinating process writes the manifest, always through a temporary file and a
rename, and only after the part's directory has its final name: a part listed as done is
complete. Anything in ``parts/`` that the manifest does not list is left over from a killed run
and is deleted before work starts.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import astuple
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import ConversionStateError, OutputPathError
from .base import DESCRIPTOR_NAME, PartSpec
from .files import atomic_write_json

__all__ = ["MANIFEST_NAME", "Staging"]

MANIFEST_NAME = "manifest.json"
_MANIFEST_FORMAT = "pickleshard-convert-manifest"
_MANIFEST_VERSION = 1


class Staging:
    """Context manager over the staging directory of the conversion to ``out``.

    On entry: creates the directory, takes the lock (another run holding it is refused with
    :class:`ConversionStateError`), loads the manifest or creates one (staging left by a run of
    another source or other options is emptied: nothing in it applies), and deletes leftovers.
    """

    def __init__(self, out: Path, identity: dict[str, Any], plan: Sequence[PartSpec]) -> None:
        self.out = out
        self.path = out.parent / f".{out.name}.partial"
        self.identity = identity
        self.plan = list(plan)
        self.done: dict[str, Any] = {}
        self.lock_fd = -1

    @property
    def finalized(self) -> bool:
        """Whether finalizing finished (the descriptor, written last, is there)."""
        return (self.path / DESCRIPTOR_NAME).is_file()

    def __enter__(self) -> Staging:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.lock_fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputPathError(
                self.out, f"cannot create the staging directory {self.path}: {exc.strerror or exc}"
            ) from None
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.lock_fd)
            raise ConversionStateError(
                self.path, "another conversion is writing here; wait for it or stop it"
            ) from None
        try:
            self._load()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def _manifest(self) -> dict[str, Any]:
        return {
            "format": _MANIFEST_FORMAT,
            "version": _MANIFEST_VERSION,
            "identity": self.identity,
            "parts": [list(astuple(p)) for p in self.plan],
            "done": self.done,
        }

    def _stored_identity(self) -> Any:
        for name, key in ((MANIFEST_NAME, "identity"), (DESCRIPTOR_NAME, "identity")):
            try:
                return json.loads((self.path / name).read_text())[key]
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError):
                return None  # unreadable: a kill cannot cause this (atomic writes); start over
        return self.identity if not (self.path / "parts").exists() else None

    def _load(self) -> None:
        stored = self._stored_identity()
        if stored != self.identity:
            # Left by a run over other files or options: nothing in it can be reused, and it
            # is ours alone (the lock is held), so start over.
            self._clear()
        manifest_path = self.path / MANIFEST_NAME
        if manifest_path.is_file() and stored == self.identity:
            manifest = json.loads(manifest_path.read_text())
            self.done = dict(manifest.get("done", {}))
        if not self.finalized:
            self._remove_leftovers()
            atomic_write_json(manifest_path, self._manifest())

    def _clear(self) -> None:
        for child in self.path.iterdir():
            if child.name == ".lock":
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        self.done = {}

    def _remove_leftovers(self) -> None:
        parts = self.path / "parts"
        parts.mkdir(exist_ok=True)
        keep = {f"part-{int(k):05d}" for k in self.done}
        for child in parts.iterdir():
            if child.name not in keep:
                shutil.rmtree(child, ignore_errors=True)

    def clear_outputs(self) -> None:
        """Delete what an interrupted finalize left (everything but parts, manifest and lock)."""
        for child in self.path.iterdir():
            if child.name in ("parts", MANIFEST_NAME, ".lock"):
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()

    def mark_done(self, spec: PartSpec, summary: dict[str, Any]) -> None:
        """Record part ``spec`` as final (its directory is already renamed into place)."""
        manifest = self._manifest()
        manifest["done"] = {**self.done, str(spec.id): summary}
        atomic_write_json(self.path / MANIFEST_NAME, manifest)
        self.done = manifest["done"]  # only once on disk: a full disk must not count it done

    def publish(self) -> None:
        """Drop parts and manifest, then rename the staging directory to ``out``."""
        shutil.rmtree(self.path / "parts", ignore_errors=True)
        (self.path / MANIFEST_NAME).unlink(missing_ok=True)
        (self.path / ".lock").unlink(missing_ok=True)  # our descriptor stays locked until exit
        replaced = self.out.parent / f".{self.out.name}.replaced"
        shutil.rmtree(replaced, ignore_errors=True)
        try:
            if os.path.lexists(self.out):
                os.rename(self.out, replaced)
            os.rename(self.path, self.out)
        except OSError as exc:
            raise OutputPathError(
                self.out, f"cannot move the finished output into place: {exc.strerror or exc}"
            ) from None
        shutil.rmtree(replaced, ignore_errors=True)
