"""One module per ``pickleshard`` subcommand; each exposes ``register(subparsers)``.

:mod:`pickleshard.cli` builds the parser from :data:`COMMANDS`, in this order (the order of
``pickleshard --help``). A command's module imports its heavy dependencies inside its handler
so that ``pickleshard inspect`` does not pay for torch.
"""

COMMANDS = ("synth", "index", "inspect", "convert", "verify", "split", "demo", "bench")
