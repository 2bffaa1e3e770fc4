"""The docs do what they say: every ```python example runs, and docs/cli.md is the real --help.

Regenerate the help blocks of docs/cli.md after changing a command:

    python tests/test_docs.py --write
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from eventlog.cli import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
CLI_MD = ROOT / "docs" / "cli.md"

NEEDS_SERVER = "<!-- examples need: postgresql -->"
"""Pages whose examples need a PostgreSQL server: tests/test_projection_postgres.py runs them."""

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
HELP_BLOCK = re.compile(r"<!-- help: (?P<name>[a-z -]*) -->\n```text\n(?P<text>.*?)```\n", re.S)


def python_blocks(page: Path) -> list[str]:
    return PYTHON_BLOCK.findall(page.read_text(encoding="utf-8"))


def help_text(name: str) -> str:
    args = [*name.split(), "--help"] if name else ["--help"]
    result = CliRunner().invoke(cli, args, prog_name="eventlog", catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def commands() -> list[str]:
    """Every command, with the subcommands of groups as ``"group sub"``."""
    names = []
    for name, command in sorted(cli.commands.items()):
        names.append(name)
        if isinstance(command, click.Group):
            names += [f"{name} {sub}" for sub in sorted(command.commands)]
    return names


def run_examples(page: Path, tmp_path: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}", "tmp": str(tmp_path)}
    for number, block in enumerate(python_blocks(page), start=1):
        code = compile(block, f"{page.name} (python example {number})", "exec")
        exec(code, namespace)


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if python_blocks(p) and NEEDS_SERVER not in p.read_text(encoding="utf-8")],
    ids=lambda p: p.name,
)
def test_python_examples_run(page, tmp_path, monkeypatch):
    """The blocks of a page run in order, in one namespace, in an empty working directory.

    Examples write to relative paths, or under ``tmp`` (a temporary directory they may use
    without defining it).
    """
    monkeypatch.chdir(tmp_path)
    run_examples(page, tmp_path)


def test_every_page_with_examples_is_checked():
    # A rename of the fence (```py) would silently skip examples; keep the count honest.
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"^```(py|python3|pycon)\s*$", text, re.M), f"{page.name}: use ```python fences"
    assert len(python_blocks(ROOT / "docs" / "integration.md")) >= 6
    assert len(python_blocks(ROOT / "docs" / "quickstart.md")) >= 3
    for integration in ["pydantic-ai", "adk"]:
        assert python_blocks(ROOT / "docs" / "integrations" / f"{integration}.md"), integration


def test_cli_md_documents_every_command():
    documented = {m["name"] for m in HELP_BLOCK.finditer(CLI_MD.read_text(encoding="utf-8"))}
    assert documented == {"", *commands()}


@pytest.mark.parametrize("name", ["", *commands()])
def test_cli_md_matches_help(name):
    blocks = {m["name"]: m["text"] for m in HELP_BLOCK.finditer(CLI_MD.read_text(encoding="utf-8"))}
    assert blocks.get(name) == help_text(name), (
        f"docs/cli.md is stale for 'eventlog {name}': run python tests/test_docs.py --write"
    )


def test_integration_md_states_the_flush_rules():
    text = (ROOT / "docs" / "integration.md").read_text(encoding="utf-8")
    for rule in ("After `log.rewind()`", "Flush a streamed reply once it is complete", "nest at most 64 levels"):
        assert rule in text, rule


def write_cli_md() -> None:
    text = CLI_MD.read_text(encoding="utf-8")

    def fill(match: re.Match[str]) -> str:
        return f"<!-- help: {match['name']} -->\n```text\n{help_text(match['name'])}```\n"

    CLI_MD.write_text(HELP_BLOCK.sub(fill, text), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_cli_md()
    else:
        sys.exit(__doc__)
