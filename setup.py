"""The optional C accelerator of the default mode's edit check (``eventlog._check``).

Everything else is configured in pyproject.toml.  The extension is optional: where no C
compiler is available the build goes on without it and the pure-Python check, which gives
the same answers, is used.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("eventlog._check", ["eventlog/_check.c"], optional=True)])
