"""Importing large JSON Lines files: the fast path (msgspec parsing, one check of the whole file)
gives what the line-by-line path gives, and a bad line anywhere names itself and writes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from eventlog import EventLog
from eventlog.cli import cli
from eventlog.interchange import ImportFormatError, read_jsonl


def run(*args: str, log: Path) -> Result:
    return CliRunner().invoke(cli, ["--log", str(log), *args], catch_exceptions=False)


def messages(count: int) -> list[dict]:
    texts = ["plain", "é", "中文", "😀", "line\u2028separator", "tab\tin text", 'quote " and \\ backslash']
    out: list[dict] = []
    for i in range(count):
        if i % 3 == 2:
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": f"c{i}", "function": {"name": "f", "arguments": json.dumps({"i": i})}}],
                }
            )
        else:
            out.append(
                {"role": "user", "content": texts[i % len(texts)] * (1 + i % 4), "n": i, "f": i / 7, "ok": i % 2 == 0}
            )
    return out


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_large_file_imports_as_its_messages_flushed(tmp_path, batch_check):
    wanted = messages(3000)
    wanted[1500]["content"] = "x" * 3_000_000 + "é"  # a huge message among small ones
    source = write(tmp_path / "big.jsonl", [json.dumps(m, ensure_ascii=False) for m in wanted])
    result = run("import", str(source), "--durability", "none", log=tmp_path / "log")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "big: 3000 messages read, 3000 written"
    with EventLog.open(tmp_path / "api", durability="none") as api:
        head = api.flush("big", wanted).head
    with EventLog.open(tmp_path / "log", readonly=True) as log:
        assert log.head("big") == head
        assert log.messages("big") == wanted
        assert log.verify().ok


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ({"role": "user", "n": 2**64}, 'message["n"]: int does not fit in 64 bits'),
        ({"role": "user", "n": -(2**63) - 1}, "int does not fit in 64 bits"),
        ({"role": "user", "deep": json.loads("[" * 70 + "]" * 70)}, "nested deeper than 64 levels"),
    ],
)
def test_a_bad_message_in_the_middle_of_a_large_file_names_its_line_and_writes_nothing(
    tmp_path, batch_check, bad, fragment
):
    lines = [json.dumps(m) for m in messages(6000)]
    lines[4321] = json.dumps(bad)
    source = write(tmp_path / "bad.jsonl", lines)
    result = run("import", str(source), "--session", "s", log=tmp_path / "log")
    assert result.exit_code == 1, result.output
    assert f"{source}:4322: " in result.stderr and fragment in result.stderr, result.stderr
    assert not (tmp_path / "log" / "data.mdb").exists()


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"role": "user", "content": "\\ud800"}', 'message["content"]: str contains a lone surrogate'),
        ('{"role": "user", "content": 1e400}', "float inf is not JSON-like"),
        ('{"role": "user", "content": Infinity}', "not a JSON-like number"),
        ('{"role": "user", "content": "x"', "not valid JSON"),
    ],
)
def test_lines_msgspec_refuses_are_read_again_and_named(tmp_path, batch_check, line, fragment):
    lines = [json.dumps(m) for m in messages(100)]
    lines[60] = line
    with pytest.raises(ImportFormatError, match=re.escape(fragment)) as caught:
        read_jsonl("\n".join(lines), name="f.jsonl")
    assert caught.value.line == 61 and str(caught.value).startswith("f.jsonl:61: ")


def test_the_first_bad_line_is_named_whatever_is_wrong_with_a_later_one(tmp_path, batch_check):
    lines = [json.dumps(m) for m in messages(100)]
    lines[10] = json.dumps({"role": "user", "n": 2**70})  # a value the log cannot store
    lines[90] = "[1, 2]"  # not an object
    with pytest.raises(ImportFormatError, match=r"^f:11: message\[\"n\"\]: int does not fit") as caught:
        read_jsonl("\n".join(lines), name="f")
    assert caught.value.line == 11
    lines[10] = json.dumps({"role": "user"})
    with pytest.raises(ImportFormatError, match=r"^f:91: expected a JSON object"):
        read_jsonl("\n".join(lines), name="f")


def test_private_keys_in_a_file_are_not_stored_nor_checked(tmp_path, batch_check):
    lines = [json.dumps(m) for m in messages(50)]
    lines[20] = json.dumps({"role": "user", "content": "kept", "_local": 2**80})
    conversation = read_jsonl("\n".join(lines))[0]
    assert conversation.messages[20]["_local"] == 2**80
    with EventLog.open(tmp_path / "log", durability="none") as log:
        log.flush("s", conversation.messages)
        assert log.messages("s")[20] == {"role": "user", "content": "kept"}
