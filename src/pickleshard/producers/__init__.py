"""Files written by the tools people use (pandas, joblib, dill, PIL, scipy.sparse, Python 2):
recognised by their bytes and read without rewriting them.

- :mod:`~.python2`: the error that says which ``encoding`` a Python 2 pickle needs.
- :mod:`~.openaudit`: every global a dataset's files need that the policy refuses, reported at
  once when the dataset opens (and what to pass for a known producer).
- :mod:`~.joblibfile`: ``joblib.dump`` files: arrays read by rows in place (uncompressed), or
  loaded whole through joblib (compressed), both under the allowlist.
- :mod:`~.pandasfile`: a pickled DataFrame or Series read as one sample per row.
- :mod:`~.plain`: PIL images and scipy sparse matrices as arrays, for conversion.

See ``docs/producers.md``.
"""
