"""The top-level namespace: every public name resolves, and moved names warn for one release."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import pickleshard


@pytest.mark.parametrize("name", pickleshard.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an exported name must not be a deprecated one
        assert getattr(pickleshard, name) is not None


def test_split_is_the_split_operation() -> None:
    from pickleshard.pipelines.split.run import SplitReport, split

    assert pickleshard.split is split
    assert pickleshard.SplitReport is SplitReport
    assert "split" in pickleshard.__all__


def test_write_synthetic_moved_out_of_the_top_level_and_still_works_with_a_warning() -> None:
    from pickleshard.pipelines.synth import write_synthetic

    assert "write_synthetic" not in pickleshard.__all__
    with pytest.warns(DeprecationWarning, match=r"pickleshard\.pipelines\.synth"):
        old = pickleshard.write_synthetic
    assert old is write_synthetic
    with pytest.warns(DeprecationWarning, match="write_synthetic"):
        from pickleshard import write_synthetic as imported  # noqa: F401


def test_unknown_names_still_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        pickleshard.no_such_thing  # noqa: B018


def test_importing_the_package_does_not_import_the_synthetic_writer() -> None:
    code = "import sys, pickleshard; print('pickleshard.pipelines.synth' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_lazy_name_is_looked_up_once_then_kept_on_the_module() -> None:
    from pickleshard.read.collate import collate

    first = pickleshard.collate
    assert first is collate
    # kept as a module attribute: the next access does not go through __getattr__ again
    assert vars(pickleshard)["collate"] is collate
    assert pickleshard.collate is first
