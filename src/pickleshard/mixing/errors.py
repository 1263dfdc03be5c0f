"""The mix's errors, both :class:`~pickleshard.errors.PickleshardError` and ``ValueError``.

They live beside the mix (``pickleshard.errors`` is at its line budget); they derive from the one
root, so ``except PickleshardError`` sees them.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import PickleshardError

__all__ = ["MixedFieldsError", "SourceExhaustedError"]


class MixedFieldsError(PickleshardError, ValueError):
    """The sources of a mix have different fields and no transform maps them to one schema."""

    def __init__(self, fields: Sequence[tuple[str, ...] | None] | str) -> None:
        if isinstance(fields, str):  # the one-argument form: a complete message (unpickling)
            super().__init__(fields)
            return
        listed = "; ".join(f"source {s}: {f!r}" for s, f in enumerate(fields) if f is not None)
        super().__init__(
            f"the sources of the mix have different fields ({listed}): give a transform per "
            "source (transforms=[...]) that maps each to one schema"
        )


class SourceExhaustedError(PickleshardError, ValueError):
    """The ``"stop"`` policy: an epoch needs more samples of a source than are left in it."""

    def __init__(self, source: int | str, size: int = 0, count: int = 0, epoch: int = 0) -> None:
        if isinstance(source, str):  # the one-argument form: a complete message (unpickling)
            super().__init__(source)
            return
        fills = size // count
        super().__init__(
            f"source {source} ({size} samples, {count} drawn per epoch) is exhausted at epoch "
            f"{epoch} under policy='stop': it fills epochs 0 to {fills - 1} only"
            if fills
            else f"source {source} has {size} samples but each epoch draws {count} from it: "
            "policy='stop' cannot fill one epoch (use 'repeat' or 'resample')"
        )
