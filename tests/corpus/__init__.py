"""The bad-input and fault corpus harness: test helpers, not part of the package.

:mod:`corpus.corpus` and :mod:`corpus.faults` make the cases (damaged, hostile and foreign files;
hostile sizes, ``BUILD`` on globals, special files, tampered indexes, files rewritten during an
epoch); :mod:`corpus.corpus_run` runs them through every entry point in worker subprocesses
(:mod:`corpus.corpus_worker`, :mod:`corpus.fault_worker`) under memory and CPU limits, and
reports. ``tests/test_bad_input.py`` and ``tests/test_faults*.py`` import it as ``corpus`` (pytest
puts ``tests/`` on the path); the workers are started with ``tests/`` on theirs.
"""
