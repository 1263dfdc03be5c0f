"""The type a sample is handed out in: the producer's, as its layout says.

Readers produce a sample as a tuple of its field values, in field order. :class:`SampleForm`
turns that tuple into the sample the producer wrote: a dict keyed by field name where the
producer wrote dicts (records or rows that are dicts, a dict of columns: the layouts whose
:attr:`~pickleshard.scan.layouts.Layout.keyed` is true), the tuple itself otherwise. Every
reader (span and whole-file reads of a :class:`~pickleshard.PickleDataset`, converted datasets
read back) hands out ``form.build(values)``; the index records the form
(:class:`~pickleshard.index.DatasetIndex`'s ``sample_form``), a converted dataset's descriptor
too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .layouts import layout_named

__all__ = ["FORM_KINDS", "FormKind", "SampleForm"]

FormKind = Literal["tuple", "dict"]
FORM_KINDS: tuple[FormKind, ...] = ("tuple", "dict")


@dataclass(frozen=True)
class SampleForm:
    """How a sample's field values (a tuple, in the order of ``fields``) become the sample:
    ``kind`` ``"tuple"`` hands out the tuple, ``"dict"`` a dict ``{field: value}`` in field
    order (what ``default_collate`` turns into a dict of batched fields)."""

    kind: FormKind
    fields: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind not in FORM_KINDS:
            raise ValueError(f"sample form must be one of {FORM_KINDS}, got {self.kind!r}")

    @classmethod
    def of_layouts(
        cls, layouts: Iterable[str], fields: Sequence[str], where: str | os.PathLike[str] = ""
    ) -> SampleForm:
        """The form of a dataset whose files have the layouts ``layouts`` (names as the files
        table keeps them): dicts when every file's samples are keyed (dicts, or columns of a
        dict), else tuples (files that disagree are handed out alike: a batch must collate).
        ``where`` names the index in the error for an unknown layout."""
        keyed = [layout_named(name, where).keyed for name in layouts]
        kind: FormKind = "dict" if keyed and all(keyed) else "tuple"
        return cls(kind, tuple(fields))

    def build(self, values: tuple[Any, ...]) -> Any:
        """The sample of the field values ``values``."""
        if self.kind == "tuple":
            return values
        return dict(zip(self.fields, values, strict=True))

    def build_many(self, values: list[Any]) -> list[Any]:
        """:meth:`build` of each of a batch's value tuples (the list itself for tuples)."""
        if self.kind == "tuple":
            return values
        fields = self.fields
        return [dict(zip(fields, v, strict=True)) for v in values]

    def collated(self, fields: list[Any]) -> Any:
        """A batch's collated fields put together as ``default_collate`` does for samples of
        this form: a list for tuples, a dict by field name for dicts."""
        if self.kind == "tuple":
            return fields
        return dict(zip(self.fields, fields, strict=True))

    def values(self, sample: Any) -> tuple[Any, ...]:
        """The field values of a sample :meth:`build` made (a dict's by field name)."""
        if isinstance(sample, dict):
            return tuple(sample[f] for f in self.fields)
        return tuple(sample)

    def as_tuples(self) -> SampleForm:
        """The same fields, handed out as tuples (what ``convert`` and ``verify`` read)."""
        return SampleForm("tuple", self.fields)
