"""pickleshard: train on folders of pickle files without loading them whole."""

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import PickleshardError, StaleIndexError
from .index import DatasetIndex
from .indexing import build_index, open_index
from .scan.ambiguity import AmbiguousLayoutWarning

if TYPE_CHECKING:
    from .dataset import DEFAULT_CACHE_BYTES, PickleDataset
    from .formats import open_dataset
    from .inspect import FileReport, inspect_file
    from .loading import Loader
    from .mixing import MixedDataset, MixSampler
    from .pipelines.convert import ConvertReport, convert
    from .pipelines.split import SplitReport, split
    from .pipelines.verify import VerifyReport, verify
    from .read.collate import collate
    from .samplers import BlockShuffleSampler, ShuffleSampler, sampler_state_from_loader

# These import torch (when installed): load them on first use so `pickleshard index` and
# `pickleshard inspect` start fast.
_LAZY = {
    "DEFAULT_CACHE_BYTES": "dataset",
    "PickleDataset": "dataset",
    "Loader": "loading",
    "MixedDataset": "mixing",
    "MixSampler": "mixing",
    "BlockShuffleSampler": "samplers",
    "ShuffleSampler": "samplers",
    "sampler_state_from_loader": "samplers",
    "ConvertReport": "pipelines.convert",
    "convert": "pipelines.convert",
    "open_dataset": "formats",
    "FileReport": "inspect",
    "inspect_file": "inspect",
    "VerifyReport": "pipelines.verify",
    "verify": "pipelines.verify",
    "SplitReport": "pipelines.split",
    "split": "pipelines.split",
    "collate": "read.collate",
}
# Old top-level names: still importable for one release, with a DeprecationWarning.
_MOVED = {"write_synthetic": "pipelines.synth"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        # kept as a module attribute: later lookups find it without calling here again
        globals()[name] = value
        return value
    if name in _MOVED:
        import importlib
        import warnings

        where = f"{__name__}.{_MOVED[name]}"
        warnings.warn(
            f"{__name__}.{name} is deprecated; import it from {where}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(where), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_CACHE_BYTES",
    "AmbiguousLayoutWarning",
    "BlockShuffleSampler",
    "ConvertReport",
    "DatasetIndex",
    "FileReport",
    "Loader",
    "MixSampler",
    "MixedDataset",
    "PickleDataset",
    "PickleshardError",
    "ShuffleSampler",
    "SplitReport",
    "StaleIndexError",
    "VerifyReport",
    "__version__",
    "build_index",
    "collate",
    "convert",
    "inspect_file",
    "open_dataset",
    "open_index",
    "sampler_state_from_loader",
    "split",
    "verify",
]
