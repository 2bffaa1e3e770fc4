"""Helpers for the reliability tests: the crash harness program and child processes.

The harness lives in ``scripts/crash_harness.py`` (a program anyone can rerun with
more kills); the tests import it from there so both always run the same code.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` as a module."""
    module_name = f"_script_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def child_env() -> dict[str, str]:
    """The environment for child Python processes: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (``sys.argv[1:]`` = ``args``) and wait for it."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
    )


class Child:
    """A Python child process that prints ``ready`` once it reached the point to kill it at."""

    def __init__(self, code: str, *args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )

    def wait_ready(self, timeout: float = 30) -> None:
        assert self.popen.stdout is not None
        deadline = time.monotonic() + timeout
        line = self.popen.stdout.readline()
        if line.strip() != "ready" or time.monotonic() > deadline:
            self.kill()
            raise AssertionError(f"child did not get ready: {line!r} {self.stderr()}")

    def kill(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        code = self.popen.wait()
        return code

    def stderr(self) -> str:
        self.kill()
        assert self.popen.stderr is not None
        return self.popen.stderr.read()

    def close(self) -> None:
        self.kill()
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def raw_env(path: Path):
    """The log's LMDB environment opened directly, to damage or inspect it below the API."""
    import lmdb

    return lmdb.open(str(path), subdir=True, max_dbs=8, max_readers=512)


def raw_events(path: Path) -> list[tuple[bytes, bytes]]:
    """Every ``(key, value)`` of the ``events`` database, read directly."""
    env = raw_env(path)
    try:
        with env.begin() as txn:
            return list(txn.cursor(db=env.open_db(b"events", txn=txn)))
    finally:
        env.close()
