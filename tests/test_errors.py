"""The error hierarchy: builtin bases, messages that say where, and surviving a trip through pickle."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest

from pickleshard import errors
from pickleshard.errors import (
    CorruptPickleError,
    DatasetNotFoundError,
    EmptyPickleError,
    FieldLengthMismatchError,
    FileChangedError,
    IndexFormatError,
    NoPickleFilesError,
    NotAPickleError,
    NotSpanIndexableError,
    PickleshardError,
    ReadMemoryError,
    StaleIndexError,
    TruncatedPickleError,
    UnreadableFileError,
    UnsafePickleError,
    UnsupportedLayoutError,
)

FILE_PROBLEMS = [
    UnreadableFileError,
    CorruptPickleError,
    EmptyPickleError,
    NotAPickleError,
    TruncatedPickleError,
    UnsupportedLayoutError,
    FieldLengthMismatchError,
    UnsafePickleError,
    FileChangedError,
    ReadMemoryError,
]


def _instances() -> list[PickleshardError]:
    made: list[PickleshardError] = [
        cls("/data/part-7.pkl", "something is wrong", offset=12, sample=3) for cls in FILE_PROBLEMS
    ]
    made += [cls("/data/part-7.pkl", "no offset given") for cls in FILE_PROBLEMS]
    made += [
        DatasetNotFoundError("/data/missing"),
        DatasetNotFoundError("/data/missing.pkl", "file"),
        DatasetNotFoundError("/data/x", "directory or file"),
        NoPickleFilesError("/data/empty", ["*.pkl", "*.pickle"]),
        StaleIndexError(
            "/data/.pickleshard", changed=["a.pkl"], removed=["b.pkl"], added=["c.pkl"]
        ),
        StaleIndexError("/data/.pickleshard", added=[f"n{i}.pkl" for i in range(13)]),
        IndexFormatError("/data/.pickleshard", "no index.json; build one"),
        IndexFormatError("/odd: name/.pickleshard", "unsupported version 9: rebuild it"),
    ]
    return made


def _ids(err: PickleshardError) -> str:
    return f"{type(err).__name__}:{str(err)[:30]}"


def test_every_public_error_derives_from_the_root() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, PickleshardError), name


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (DatasetNotFoundError, FileNotFoundError),
        (NoPickleFilesError, FileNotFoundError),
        (UnreadableFileError, OSError),
        (CorruptPickleError, ValueError),
        (EmptyPickleError, CorruptPickleError),
        (NotAPickleError, CorruptPickleError),
        (TruncatedPickleError, CorruptPickleError),
        (UnsupportedLayoutError, ValueError),
        (FieldLengthMismatchError, UnsupportedLayoutError),
        (IndexFormatError, ValueError),
        (UnsafePickleError, pickle.UnpicklingError),
        (NotSpanIndexableError, ValueError),
        (StaleIndexError, ValueError),
    ],
)
def test_errors_also_derive_from_the_matching_builtin(cls: type, builtin: type) -> None:
    assert issubclass(cls, builtin)


def test_all_lists_each_error_once() -> None:
    assert len(errors.__all__) == len(set(errors.__all__))
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, PickleshardError)
        and value.__module__ == errors.__name__
    }
    assert set(errors.__all__) == defined - {"FileProblem"}


@pytest.mark.parametrize("name", [n for n in errors.__all__ if n != "PickleshardError"])
def test_every_error_also_derives_from_a_builtin_besides_exception(name: str) -> None:
    """The module's promise: ``except ValueError`` (or ``OSError``, or
    ``pickle.UnpicklingError``...) works for callers that know nothing of pickleshard."""
    ours = (errors.__name__,)
    others = [
        base
        for base in getattr(errors, name).__mro__
        if base.__module__ not in ours and base not in (Exception, BaseException, object)
    ]
    assert others, f"{name} derives from no builtin exception besides Exception"


def test_file_problem_message_says_file_byte_and_sample() -> None:
    err = TruncatedPickleError("/d/a.pkl", "stream ends before STOP", offset=40, sample=2)
    assert str(err) == "/d/a.pkl at byte 40 (sample 2): stream ends before STOP"
    assert (err.path, err.offset, err.sample) == ("/d/a.pkl", 40, 2)
    assert str(NotAPickleError("/d/b.pkl", "text")) == "/d/b.pkl: text"


def test_stale_index_error_lists_each_kind_and_caps_long_lists() -> None:
    err = StaleIndexError("/i", changed=["a.pkl"], removed=["b.pkl"])
    assert "changed: a.pkl" in str(err)
    assert "removed: b.pkl" in str(err)
    assert "added" not in str(err)
    many = StaleIndexError("/i", added=[f"f{i:02d}.pkl" for i in range(15)])
    assert "f09.pkl" in str(many)
    assert "f10.pkl" not in str(many)
    assert "and 5 more" in str(many)
    assert len(many.added) == 15


@pytest.mark.parametrize("err", _instances(), ids=_ids)
def test_errors_survive_pickling(err: PickleshardError) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert back.args == err.args
    for attr in ("path", "offset", "sample", "changed", "removed", "added", "patterns"):
        assert getattr(back, attr, None) == getattr(err, attr, None), attr


def _raise_in_worker(path: str) -> None:
    raise FieldLengthMismatchError(path, "fields have different lengths: len(x) = 3, len(y) = 2")


def test_errors_cross_a_process_pool() -> None:
    with ProcessPoolExecutor(1, mp_context=get_context("fork")) as pool:
        future = pool.submit(_raise_in_worker, "/d/bad.pkl")
        with pytest.raises(FieldLengthMismatchError) as info:
            future.result()
    assert str(info.value) == "/d/bad.pkl: fields have different lengths: len(x) = 3, len(y) = 2"
    assert info.value.path == "/d/bad.pkl"


def test_stale_index_error_keeps_its_relinked_note_through_pickling() -> None:
    """An index worker's StaleIndexError crosses a process boundary by pickling: the note that
    the changed files were only copied or relinked must survive it."""
    err = StaleIndexError("/i", changed=["a.pkl"], relinked=["a.pkl"])
    back = pickle.loads(pickle.dumps(err))
    assert back.relinked == ("a.pkl",)
    assert str(back) == str(err)
    assert "new inode or ctime" in str(back)
