"""convert of several weighted sources into one output: the mix's epoch in its order, parallel,
resumable, verified against its sources; bad weights and sources refused with clear errors.

Each source is a folder of ``pickle.dump((x_list, y_list))`` files whose ``y`` is a sample id
unique across sources (``1000 * source + k``). The oracle of a position is ``pickle.load`` of
the source's files at the sample :meth:`MixedDataset.locate` names (plus the source index when
tagged); the output read back must equal it and ``[mix[i] for i in range(len(mix))]``.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixsources import oracle, write_source
from pickleshard import PickleDataset
from pickleshard.cli import main
from pickleshard.errors import UnencodableValueError, VerifyMismatchError
from pickleshard.formats import open_dataset
from pickleshard.formats.memmap import MemmapPartWriter
from pickleshard.mixing import MixedDataset, MixedFieldsError, SourceExhaustedError
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.mixed import recorded_mix
from pickleshard.pipelines.verify.run import verify
from pickleshard.testing import assert_same
from pickleshard.testing.formats import WritesUnpicklable, tree_bytes

SIZES = (60, 35, 25)


class Crash(Exception):
    """Stands in for a kill at a chosen point."""


class Renamed(list[tuple[Any, ...]]):
    """A map-style dataset whose fields have other names than the pickle folders'."""

    fields = ("image", "label")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("sources")
    for s, n in enumerate(SIZES):
        write_source(root / f"s{s}", s, n)
    return [root / f"s{s}" for s in range(len(SIZES))]


def expected(mix: MixedDataset, folders: list[Path]) -> list[tuple[Any, ...]]:
    """The mix's epoch by the pickle.load oracle: position i holds the sample locate names."""
    data = [oracle(f) for f in folders]
    sources, samples = mix.locate(range(len(mix)))
    tag = (lambda s: (s,)) if mix.tag else (lambda s: ())
    return [(*data[s][j], *tag(s)) for s, j in zip(sources.tolist(), samples.tolist(), strict=True)]


def read_back(out: Path) -> list[Any]:
    ds = open_dataset(out, shuffle=False)
    return list(ds.__getitems__(list(range(len(ds)))))


def assert_samples(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(tuple(g), tuple(w), f"sample {i}")


@pytest.mark.parametrize("to", ["memmap", "lmdb", "parquet"])
def test_the_output_is_the_mixs_epoch_in_its_order(
    tmp_path: Path, folders: list[Path], to: str
) -> None:
    mix = MixedDataset(
        [PickleDataset(f) for f in folders], [0.5, 0.3, 0.2], epoch_size=150, seed=7, tag=True
    )
    report = convert(mix, tmp_path / "out", to=to, jobs=1)
    assert report.num_samples == 150
    got = read_back(tmp_path / "out")
    assert_samples(got, expected(mix, folders))
    assert_samples(got, [mix[i] for i in range(len(mix))])
    assert open_dataset(tmp_path / "out").fields == ("x", "y", "source")
    counts = np.bincount([s for *_, s in got], minlength=3)
    assert counts.tolist() == mix.counts == [75, 45, 30]  # source 0 repeats, 2 repeats


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    weights=st.lists(st.integers(0, 5), min_size=3, max_size=3).filter(lambda w: sum(w) > 0),
    epoch_size=st.integers(1, 200),
    seed=st.integers(0, 2**32),
    policy=st.sampled_from(["repeat", "resample"]),
)
def test_weights_and_sources_give_the_same_output_as_the_mix(
    tmp_path_factory: pytest.TempPathFactory,
    folders: list[Path],
    weights: list[int],
    epoch_size: int,
    seed: int,
    policy: Any,
) -> None:
    out = tmp_path_factory.mktemp("out") / "out"
    convert(folders, out, weights=weights, epoch_size=epoch_size, seed=seed, policy=policy, jobs=1)
    sources = [PickleDataset(f) for f in folders]
    mix = MixedDataset(sources, weights, epoch_size=epoch_size, seed=seed, policy=policy)
    assert_samples(read_back(out), expected(mix, folders))
    assert recorded_mix(out) is not None
    assert verify(folders, out).checked == epoch_size


def test_a_mix_set_to_another_epoch_writes_that_epoch(tmp_path: Path, folders: list[Path]) -> None:
    mix = MixedDataset([PickleDataset(f) for f in folders[:2]], [2, 1], epoch_size=90, seed=1)
    mix.set_epoch(3)
    convert(mix, tmp_path / "out", jobs=1)
    assert_samples(read_back(tmp_path / "out"), expected(mix, folders[:2]))
    assert recorded_mix(tmp_path / "out")["epoch"] == 3  # type: ignore[index]
    fresh = MixedDataset([PickleDataset(f) for f in folders[:2]], [2, 1], epoch_size=90, seed=1)
    assert verify(fresh, tmp_path / "out").checked == 90  # the recorded epoch, not the mix's


def test_parallel_and_resumed_runs_write_the_same_bytes(
    tmp_path: Path, folders: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    mix_args: dict[str, Any] = {"weights": [0.5, 0.3, 0.2], "epoch_size": 300, "seed": 2}
    convert(folders, tmp_path / "one", jobs=1, **mix_args)
    report = convert(folders, tmp_path / "two", jobs=2, **mix_args)
    assert report.parts == 5  # positions in runs of 64: parallel over parts
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")

    real = MemmapPartWriter.write

    def write_then_crash(self: Any, index: int, sample: Any) -> None:
        if index == 200:
            raise Crash
        real(self, index, sample)

    monkeypatch.setattr(MemmapPartWriter, "write", write_then_crash)
    with pytest.raises(Crash):
        convert(folders, tmp_path / "resumed", jobs=1, **mix_args)
    monkeypatch.undo()
    report = convert(folders, tmp_path / "resumed", jobs=1, **mix_args)
    assert report.parts_reused == 3  # positions 0-191 were finished
    assert tree_bytes(tmp_path / "resumed") == tree_bytes(tmp_path / "one")
    assert convert(folders, tmp_path / "resumed", jobs=1, **mix_args).already_done


def test_a_list_of_files_mixes_with_a_converted_folder(tmp_path: Path, folders: list[Path]) -> None:
    convert(folders[1], tmp_path / "conv", jobs=1)
    sources = [sorted(folders[0].glob("*.pkl")), tmp_path / "conv"]  # a list of files is one
    convert(sources, tmp_path / "out", weights=[0.5, 0.5], epoch_size=80, seed=5, jobs=1)
    mix = MixedDataset(
        [PickleDataset(folders[0]), PickleDataset(folders[1])], [0.5, 0.5], epoch_size=80, seed=5
    )
    assert_samples(read_back(tmp_path / "out"), expected(mix, folders[:2]))
    assert verify(sources, tmp_path / "out").against == "source"


def test_verify_of_a_mix_says_what_it_needs(tmp_path: Path, folders: list[Path]) -> None:
    out = tmp_path / "out"
    convert(folders[:2], out, weights=[0.6, 0.4], epoch_size=50, seed=9, jobs=1)
    assert verify(None, out).against == "stored hashes"
    with pytest.raises(VerifyMismatchError, match=r"mix of 2 source.*got 1 source.*in order"):
        verify(folders[0], out)
    other = MixedDataset([PickleDataset(f) for f in folders[:2]], [0.6, 0.4], epoch_size=50)
    with pytest.raises(VerifyMismatchError, match=r"seed 9.*the mix given differs"):
        verify(other, out)
    with pytest.raises(VerifyMismatchError, match=r"source 0 .* has 35 samples now, 60 then"):
        verify(folders[1::-1], out)  # the sources swapped
    plain = tmp_path / "plain"
    convert(folders[0], plain, jobs=1)
    mix = MixedDataset([PickleDataset(folders[0])], [1])
    with pytest.raises(VerifyMismatchError, match="converted from one source, not a mix"):
        verify(mix, plain)


def test_a_changed_source_is_named_by_verify(tmp_path: Path) -> None:
    write_source(tmp_path / "a", 0, 20)
    write_source(tmp_path / "b", 1, 10)
    out = tmp_path / "out"
    convert([tmp_path / "a", tmp_path / "b"], out, weights=[1, 1], epoch_size=20, jobs=1)
    write_source(tmp_path / "b", 1, 12, files=4)
    with pytest.raises(VerifyMismatchError, match=r"source 1 .* has 12 samples now, 10 then"):
        verify([tmp_path / "a", tmp_path / "b"], out)


def test_bad_mix_arguments_raise_clear_errors(tmp_path: Path, folders: list[Path]) -> None:
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="3 datasets but 2 weights"):
        convert(folders, out, weights=[0.5, 0.5], jobs=1)
    with pytest.raises(ValueError, match="positive sum"):
        convert(folders, out, weights=[0, 0, 0], jobs=1)
    with pytest.raises(ValueError, match="epoch_size, seed apply to a mix: pass weights="):
        convert(folders[0], out, epoch_size=10, seed=3, jobs=1)
    mix = MixedDataset([PickleDataset(f) for f in folders])
    with pytest.raises(ValueError, match=r"its own weights.*do not pass weights, tag"):
        convert(mix, out, weights=[1, 1, 1], tag=True, jobs=1)
    with pytest.raises(
        SourceExhaustedError, match="source 0 has 60 samples but each epoch draws 100"
    ):
        convert(folders, out, weights=[0.5, 0.3, 0.2], epoch_size=200, policy="stop", jobs=1)
    renamed = Renamed([(np.zeros(2, np.float32), 1)] * 5)
    with pytest.raises(MixedFieldsError, match=r"source 1: \('image', 'label'\)"):
        convert([folders[0], renamed], out, weights=[1, 1], jobs=1)
    assert not out.exists()


def test_an_unencodable_value_names_its_source_file_and_position(tmp_path: Path) -> None:
    write_source(tmp_path / "a", 0, 10, files=1)
    (tmp_path / "b").mkdir()
    with open(tmp_path / "b" / "odd.pkl", "wb") as fh:
        pickle.dump(([np.zeros(2, np.float32)] * 4, [WritesUnpicklable()] * 4), fh)
    b = PickleDataset(tmp_path / "b", trusted=True)
    with pytest.raises(UnencodableValueError) as err:
        convert([tmp_path / "a", b], tmp_path / "out", weights=[1, 1], epoch_size=8, jobs=1)
    text = str(err.value)
    assert "odd.pkl" in text
    assert "source 1's sample" in text
    assert "mix position" in text
    assert "field 'y'" in text


def test_cli_converts_verifies_and_refuses_a_mix(
    tmp_path: Path, folders: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = (str(f) for f in folders[:2])
    out = str(tmp_path / "out")
    mix_flags = ["--weights", "0.7,0.3", "--epoch-size", "100", "--seed", "4", "--tag"]
    assert main(["convert", a, b, out, *mix_flags, "--to", "lmdb", "--jobs", "2", "--verify"]) == 0
    assert "verified 100 samples" in capsys.readouterr().out
    mix = MixedDataset(
        [PickleDataset(f) for f in folders[:2]], [0.7, 0.3], epoch_size=100, seed=4, tag=True
    )
    assert_samples(read_back(tmp_path / "out"), expected(mix, folders[:2]))
    assert main(["verify", a, b, out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["against"] == "source"
    assert main(["verify", a, out]) == 1
    assert "give all of them, in order" in capsys.readouterr().err
    counts = str(tmp_path / "counts")
    assert main(["convert", a, b, counts, "--weights", "30,10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 40


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "2 sources given: mixing them needs --weights W1,...,W2"),
        (["--weights", "0.5"], "2 source(s) but 1 weights in --weights"),
        (["--weights", "0.5,x"], "expected numbers >= 0 with a positive sum"),
        (["--weights", "0,0"], "expected numbers >= 0 with a positive sum"),
        (["--weights", "1,1", "--epoch-size", "0"], "expected a whole number >= 1"),
        (["--weights", "1,1", "--when-exhausted", "cycle"], "invalid choice: 'cycle'"),
    ],
)
def test_cli_refuses_bad_weights_and_sources(
    tmp_path: Path,
    folders: list[Path],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["convert", str(folders[0]), str(folders[1]), str(tmp_path / "out"), *extra])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_mix_flags_without_weights(
    tmp_path: Path, folders: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["convert", str(folders[0]), str(tmp_path / "out"), "--seed", "3", "--tag"])
    assert "--seed, --tag apply to a mix: give --weights" in capsys.readouterr().err
    assert (
        main(
            [
                "convert",
                str(folders[0]),
                str(tmp_path / "nope" / "x"),
                "--weights",
                "1",
                "--epoch-size",
                "1000",
                "--when-exhausted",
                "stop",
            ]
        )
        == 1
    )
    assert "policy='stop' cannot fill one epoch" in capsys.readouterr().err
