"""One text rule: ``eventlog show`` prints the text the projection's ``content`` column holds."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from eventlog import EventLog
from eventlog.cli import cli
from eventlog.text import text_of
from projections import SQLiteProjection

MIXED = [
    {"type": "text", "text": "look at this"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    {"type": "thinking", "thinking": "not display text"},
    {"type": "refusal", "refusal": "cannot"},
    {"type": "tool_result", "content": [{"type": "text", "text": "result text"}]},
    {"type": "input_audio", "input_audio": {"data": "..."}},
    {"type": "custom_widget"},
]


def test_text_of_keeps_text_and_placeholders_and_drops_what_is_not_display_text() -> None:
    assert text_of(MIXED) == "look at this\n[image]\ncannot\nresult text\n[audio]\n[custom_widget]"
    assert text_of("plain") == "plain"
    assert text_of(None) is None
    assert text_of({"type": "text", "text": "one part"}) == "one part"
    assert text_of(42) == "42"


def test_show_and_the_projection_content_column_render_content_alike(tmp_path: Path) -> None:
    messages = [
        {"role": "user", "content": MIXED},
        {"role": "assistant", "content": [{"type": "output_text", "text": "seen"}, {"type": "reasoning"}]},
    ]
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("s", messages)
        projection = SQLiteProjection(tmp_path / "t.db")
        try:
            projection.catch_up(log)
            columns = [row["content"] for row in projection.messages("s")]
        finally:
            projection.close()
    assert columns == [text_of(m["content"]) for m in messages]
    result = CliRunner().invoke(cli, ["--log", str(path), "show", "s", "--full"])
    assert result.exit_code == 0, result.output
    for column in columns:
        assert column.replace("\n", "\n    ") in result.output  # whole; each line break a continuation line
    assert "not display text" not in result.output
