"""pickleshard: train on folders of pickle files without loading them whole."""

from .dataset import DEFAULT_CACHE_BYTES, PickleDataset
from .errors import PickleshardError, StaleIndexError
from .index import DatasetIndex, build_index, open_index
from .sampling import BlockShuffleSampler
from .synth import write_synthetic

from ._version import __version__

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "BlockShuffleSampler",
    "DatasetIndex",
    "PickleDataset",
    "PickleshardError",
    "StaleIndexError",
    "__version__",
    "build_index",
    "open_index",
    "write_synthetic",
]
