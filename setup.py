"""Builds the compiled scanner (``pickleshard._cscan``); everything else is in pyproject.toml.

The extension is optional: where it cannot be compiled (no C compiler) the install goes on with
a warning and the scanner runs its pure-Python reference (``tests/test_cscan.py`` fails in a dev
install without it). After editing the ``.pyx``, rebuild with ``pip install -e .`` (``make``
does it by itself).
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = cythonize(
    [Extension("pickleshard._cscan", ["src/pickleshard/_cscan.pyx"])],
    compiler_directives={"language_level": 3},
)
for ext in extensions:
    ext.optional = True  # set after cythonize, which does not carry it over
setup(ext_modules=extensions)
