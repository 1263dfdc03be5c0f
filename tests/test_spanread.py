"""SpanReader: every sample of every layout equals ``pickle.load`` of the whole file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from picklegen import assert_same, build, datasets, oracle, write
from pickleshard.errors import NotSpanIndexableError, UnsupportedLayoutError
from pickleshard.scan import ScanResult, scan_file
from pickleshard.spanread import SpanReader

# Reasons the scanner may give for a generated file it will not read span by span.
_ALLOWED_REFUSALS = ("cannot establish", "cannot evaluate", "differs from the first")


def _check_file(path: Path, protocol: int = 5, **reader_kwargs: Any) -> ScanResult | None:
    encoding = {k: v for k, v in reader_kwargs.items() if k == "encoding"}
    try:
        names, want = oracle(path)
    except UnsupportedLayoutError:  # not a layout at all: the scanner must not claim it is
        with pytest.raises((NotSpanIndexableError, UnsupportedLayoutError)):
            scan_file(path, **encoding)
        return None
    try:
        scan = scan_file(path, **encoding)
    except NotSpanIndexableError as exc:
        refusal = exc
    else:
        refusal = None
    if refusal is not None:
        array_field_at_2 = protocol == 2 and refusal.reason.startswith("a field is a numpy array")
        assert array_field_at_2 or any(r in refusal.reason for r in _ALLOWED_REFUSALS), refusal
        return None
    assert scan.fields == names
    assert scan.num_samples == len(want)
    for general in (False, True):
        with SpanReader(scan, general=general, **reader_kwargs) as reader:
            for i, sample in enumerate(want):
                assert_same(reader.read_sample(i), sample, _path=f"general={general} sample {i}")
            order = list(range(len(want)))[::-1]
            for got, i in zip(reader.read_samples(order), order, strict=True):
                assert_same(got, want[i])
    return scan


@settings(max_examples=70, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=datasets())
def test_every_sample_equals_pickle_load(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]
) -> None:
    path = tmp_path_factory.mktemp("gen") / "f.pkl"
    write(
        path,
        build(data["layout"], data["columns"], data["names"]),
        data["protocol"],
        numpy1=data["numpy1"],
    )
    _check_file(path, data["protocol"])
