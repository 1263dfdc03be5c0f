"""One module per ``pickleshard`` subcommand; each exposes ``register(subparsers)``.

:mod:`pickleshard.cli` lists every command of :data:`COMMANDS` (in this order, the order of
``pickleshard --help``) and imports the module of the one command it runs, by its name: a
command's module imports its pipeline at the top, and ``pickleshard inspect`` or ``--help`` does
not pay for what ``convert`` needs (torch).
"""

#: name -> the one-line summary ``pickleshard --help`` shows (the command's parser uses it too)
COMMANDS = {
    "synth": "write a synthetic dataset of (x_list, y_list) pickle files",
    "index": "index a directory, glob or file of pickles",
    "inspect": "show a pickle's layout, samples and the globals it would load, without loading it",
    "convert": "convert a pickle dataset to memmap, lmdb, webdataset, parquet or arrow (resumable)",
    "verify": "check a conversion: against SRC, or (OUT alone) against its stored digests",
    "split": "split one big pickle into chunk pickles of the same layout (bounded memory)",
    "profile": "run a few hundred batches through pickleshard.Loader: where the time goes, what would help",
    "demo": "synthesise ~200 MB, index it, train a tiny model one epoch",
    "bench": "run the benchmarks (from a source checkout); see bench --help",
}
