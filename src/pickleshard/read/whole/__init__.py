"""Whole-file reads: :mod:`.load` (unpickle a file at once), :mod:`.cache` (the whole-file cache
and its byte budget), :mod:`.mapped` (whole files shared with workers through a mapped cache).
"""
