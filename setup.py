"""Builds the compiled scanner (``pickleshard._cscan``); everything else is in pyproject.toml.

The extension is optional at run time: without it the scanner runs its pure-Python reference.
After editing the ``.pyx``, rebuild with ``pip install -e .`` (``make`` does it by itself).
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("pickleshard._cscan", ["src/pickleshard/_cscan.pyx"])],
        compiler_directives={"language_level": 3},
    )
)
