"""The optional C accelerators: the default mode's edit check (``eventlog._check``), the
batch check of a bulk flush (``eventlog._plain``), the hash of a large event on a native
thread (``eventlog._digest``, linked with OpenSSL's libcrypto) and the shaping of a SQLite
projection's rows for ``executemany`` (``projections._rows``).

Everything else is configured in pyproject.toml.  The extensions are optional: where no C
compiler is available the build goes on without them and the pure-Python code, which gives
the same answers, is used.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("eventlog._check", ["eventlog/_check.c"], optional=True),
        Extension("eventlog._plain", ["eventlog/_plain.c"], optional=True),
        Extension("eventlog._digest", ["eventlog/_digest.c"], libraries=["crypto"], optional=True),
        Extension("projections._rows", ["projections/_rows.c"], optional=True),
    ]
)
