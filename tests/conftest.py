from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from factories import with_or_without_plain

from eventlog import EventLog, codec

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the benchmarks package, for the tests of benchmarks (pytest adds tests/ only)
    sys.path.insert(0, str(ROOT))

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
"""Under CI every test must run: a skipped test (a framework not installed, a server that did
not start) fails the run instead of passing it quietly."""


@pytest.fixture(params=["C walk", "pure-Python passes"])
def batch_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with each implementation of the batch check of message values."""
    return with_or_without_plain(codec, request, monkeypatch)


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``mount_tmpfs(size)``: a tmpfs of ``size`` (``"3m"``) mounted for this test, unmounted after
    it, or a skip where mounting is not permitted."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mountpoint = tmp_path / f"mnt-{uuid.uuid4().hex[:8]}"
        mountpoint.mkdir()
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.SubprocessError) as e:
            pytest.skip(f"cannot mount a tmpfs here: {e}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(mountpoint)
        return mountpoint

    try:
        yield mount
    finally:
        for mountpoint in mounted:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, timeout=20)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    with EventLog.open(tmp_path / "log") as opened:
        yield opened


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    if IN_CI and skipped:
        terminalreporter.write_line(f"CI: {len(skipped)} tests were skipped; every test must run in CI", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if IN_CI and skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# -- PostgreSQL ------------------------------------------------------------------

POSTGRES_ENV = "EVENTLOG_TEST_POSTGRES"
"""The DSN of a PostgreSQL server for the tests (.ci/run starts one); without it the tests
start a throwaway cluster with scripts/pg_cluster.sh, or skip when none can start."""


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    import subprocess
    import tempfile

    given = os.environ.get(POSTGRES_ENV)
    if given:
        yield given
        return
    script = Path(__file__).resolve().parent.parent / "scripts" / "pg_cluster.sh"
    # Not under pytest's temporary folder: the server runs as another user, who must reach it.
    folder = Path(tempfile.mkdtemp(prefix="eventlog-test-pg-")) / "cluster"
    started = subprocess.run(["bash", str(script), "start", str(folder)], capture_output=True, text=True)
    if started.returncode != 0:
        reason = (started.stderr.strip().splitlines() or ["no reason given"])[-1]
        pytest.skip(f"no PostgreSQL server: set {POSTGRES_ENV} or install PostgreSQL ({reason})")
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run(["bash", str(script), "stop", str(folder)], capture_output=True)
        folder.parent.rmdir()


@pytest.fixture
def pg_schema(postgres_dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A PostgreSQL schema of this test's own, dropped afterwards."""
    import re
    import uuid

    import psycopg

    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40] + "_" + uuid.uuid4().hex[:8]
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def pg_database(postgres_dsn: str) -> Iterator[str]:
    """The URL of a PostgreSQL database of this test's own, dropped afterwards."""
    import uuid

    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(postgres_dsn)
    yield f"postgresql://{params.get('user', 'postgres')}@{params['host']}:{params['port']}/{name}"
    with psycopg.connect(make_conninfo(postgres_dsn), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
