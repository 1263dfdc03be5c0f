"""Objects that load but that no format stores as they are, in their obvious array form.

``convert`` hands every sample through :class:`ConvertTransform` before encoding it: the
dataset's own ``transform``, then the ``transform=`` given to ``convert`` (any callable from a
sample tuple to a sample tuple), then :func:`plain_value` on each field:

- a PIL image becomes its pixels, ``np.asarray(image)``: ``uint8`` ``(H, W)`` for mode ``L``,
  ``(H, W, 3)`` for ``RGB``, ``(H, W, 4)`` for ``RGBA`` (a palette image ``P`` is converted
  to ``RGB`` / ``RGBA`` first; 16-bit and float modes keep their dtype);
- a scipy sparse matrix or array becomes the CSR triplet and shape
  ``(data, indices, indptr, shape)`` (``scipy.sparse.csr_matrix((data, indices, indptr),
  shape)`` rebuilds it);

and any other value is left as it is (a value the format cannot store then raises
:class:`~pickleshard.errors.UnencodableValueError` naming the field, which suggests
``transform=``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["TRANSFORM_HINT", "ConvertTransform", "plain_sample", "plain_value"]

TRANSFORM_HINT = (
    "pass convert(..., transform=f) (a callable applied to each sample tuple before encoding) "
    "that turns this field into arrays, numbers or strings"
)


def _pil_pixels(value: Any) -> np.ndarray | None:
    image_mod = sys.modules.get("PIL.Image")
    if image_mod is None or not isinstance(value, image_mod.Image):
        return None
    if value.mode in ("P", "PA"):
        value = value.convert(
            "RGBA" if "transparency" in value.info or value.mode == "PA" else "RGB"
        )
    return np.asarray(value)


def _sparse_triplet(value: Any) -> tuple[Any, ...] | None:
    sparse = sys.modules.get("scipy.sparse")
    if sparse is None or not sparse.issparse(value):
        return None
    csr = value.tocsr()
    return (csr.data, csr.indices, csr.indptr, tuple(int(n) for n in csr.shape))


def plain_value(value: Any) -> Any:
    """``value`` in its array form when it is a PIL image or a scipy sparse matrix (see the
    module docstring), else ``value`` itself."""
    if type(value).__module__.startswith(("PIL.", "scipy.sparse")):
        for convert in (_pil_pixels, _sparse_triplet):
            got = convert(value)
            if got is not None:
                return got
    return value


def plain_sample(sample: Any) -> Any:
    """Each field of a sample tuple through :func:`plain_value`; a non-tuple as it is."""
    if type(sample) is not tuple:
        return sample
    return tuple(plain_value(v) for v in sample)


class ConvertTransform:
    """What ``convert`` applies to each sample: ``first`` (the dataset's transform), then
    ``then`` (convert's ``transform=``), then :func:`plain_sample`. Picklable when both are,
    so it travels to the processes that write parts."""

    def __init__(
        self, first: Callable[[Any], Any] | None, then: Callable[[Any], Any] | None
    ) -> None:
        self.first, self.then = first, then

    def __call__(self, sample: Any) -> Any:
        if self.first is not None:
            sample = self.first(sample)
        if self.then is not None:
            sample = self.then(sample)
        return plain_sample(sample)
