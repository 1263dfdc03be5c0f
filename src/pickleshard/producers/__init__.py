"""Files written by the tools people use (pandas, joblib, dill, PIL, scipy.sparse, Python 2):
recognised by their bytes and read without rewriting them.

- :mod:`~.python2`: the error that says which ``encoding`` a Python 2 pickle needs.
- :mod:`~.foreign`: the hooks the readers call for files other tools wrote.
- :mod:`~.joblibfile`: ``joblib.dump`` files: arrays read by rows in place (uncompressed), or
  loaded whole through joblib (compressed), both under the allowlist.
- :mod:`~.pandasfile`: a pickled DataFrame or Series read as one sample per row.
- :mod:`~.plain`: PIL images and scipy sparse matrices as arrays, for conversion.

The up-front audit of every global a dataset's files need that the policy refuses is
:mod:`pickleshard.indexing.openaudit`. See ``docs/producers.md``.
"""
