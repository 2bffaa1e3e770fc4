"""Property: projecting incrementally, with restarts at random points, equals rebuilding.

Random histories of flushes, appends, edits, replacements, rewinds, compactions (by the
API and through a flush), forks, display overrides (numbers past SQLite's range included),
metadata and counter updates (sums past 64 bits and near the largest float included) and
closes are written to a real log.  One projection follows the
log with catch-ups in random batch sizes and search lags and is closed and reopened
at random points; at the end it must equal a projection rebuilt from scratch, table
by table and term by term in the search index, its live rows must be the log's live
transcript for every session, and search must find exactly the live rows holding a word.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_projection_sqlite import dump

from eventlog import EventLog
from projections import SQLiteProjection, core

WORDS = ["alpha", "bravo", "cedar", "delta", "ember", "fjord", "gamma", "haze", "iris", "jade"]
SESSIONS = ["s0", "s1", "s2"]

words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)
message = st.one_of(
    st.builds(lambda w: {"role": "user", "content": w}, words),
    st.builds(lambda w: {"role": "assistant", "content": w, "reasoning": "hmm"}, words),
    st.builds(
        lambda w, n: {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{n}", "type": "function", "function": {"name": "find", "arguments": json.dumps({"q": w})}}
            ],
        },
        words,
        st.integers(0, 3),
    ),
    st.builds(lambda w: {"role": "tool", "tool_call_id": "c0", "name": "find", "content": w}, words),
    st.builds(
        lambda w: {
            "role": "user",
            "content": [{"type": "text", "text": w}, {"type": "image_url", "image_url": {"url": "x"}}],
        },
        words,
    ),
)
session = st.sampled_from(SESSIONS)
index = st.integers(0, 30)
# Numbers as the log takes them, SQLite's limits included (a 64-bit unsigned one is stored as text).
number = st.one_of(st.integers(0, 10**12), st.integers(2**63 - 2, 2**64 - 1), st.floats(0, 1e6))
override = st.fixed_dictionaries(
    {"content": words},
    optional={
        "display_kind": words,
        "timestamp": st.one_of(number, words),
        "platform_message_id": st.one_of(words, number),
        "role": st.sampled_from(["user", "assistant"]),
        "extra": words,
    },
)
operation = st.one_of(
    st.tuples(st.just("extend"), session, st.lists(message, min_size=1, max_size=4)),
    st.tuples(st.just("append"), session, st.lists(message, min_size=1, max_size=3)),
    st.tuples(st.just("edit"), session, index, message),
    st.tuples(st.just("truncate"), session, index),
    st.tuples(st.just("replace"), session, st.lists(message, min_size=1, max_size=3)),
    st.tuples(st.just("rewind"), session, index),
    st.tuples(st.just("compact"), session, index, index, st.lists(message, min_size=0, max_size=2)),
    st.tuples(st.just("flush_summary"), session, index, st.lists(message, min_size=1, max_size=2)),
    st.tuples(st.just("fork"), session, st.sampled_from(SESSIONS), index),
    st.tuples(st.just("override"), session, index, override),
    st.tuples(
        st.just("update"),
        session,
        st.dictionaries(
            st.sampled_from(["title", "model", "topic"]),
            st.one_of(words, st.none(), st.lists(st.integers(-5, 5), max_size=2)),
            max_size=2,
        ),
        st.dictionaries(
            st.sampled_from(["input_tokens", "cost_usd", "api_calls"]),
            st.one_of(number, st.floats(1e307, 1.7e308)),
            max_size=2,
        ),
    ),
    st.tuples(st.just("close"), session, words),
)
projection_step = st.one_of(
    st.tuples(st.just("catch_up"), st.integers(1, 12)),
    st.tuples(st.just("restart"), st.integers(1, 12), st.sampled_from([0, 1, 3, 1000])),
    st.tuples(st.just("search"), st.sampled_from(WORDS)),
    st.just(("nothing",)),
)


def run(log: EventLog, op: tuple[Any, ...]) -> None:
    kind, sid = op[0], op[1]
    live = log.messages(sid) if sid in log else []
    if kind == "extend":
        log.flush(sid, live + op[2])
    elif kind == "append":
        log.append(sid, op[2])
    elif kind == "replace" and sid in log:
        log.flush(sid, op[2], replace=True)
    elif kind == "flush_summary" and live:  # an agent's own compaction, through flush
        k = op[2] % len(live)
        log.flush(sid, live[:k] + [{**m, "_compressed_summary": True} for m in op[3]] + live[k + 1 :])
    elif kind == "edit" and live:
        k = op[2] % len(live)
        log.flush(sid, live[:k] + [op[3]] + live[k + 1 :], replace=k == 0)
    elif kind == "truncate" and live:
        k = op[2] % len(live)
        log.flush(sid, live[:k] if k else live[:1], replace=k == 0)
    elif kind == "rewind" and live:
        log.rewind(sid, to=op[2] % (len(live) + 1))
    elif kind == "compact" and live:
        start = op[2] % (len(live) + 1)
        end = start + op[3] % (len(live) - start + 1)
        summary = [{**m, "_compressed_summary": True} for m in op[4]]
        log.compact(sid, start=start, end=end, summary=summary)
    elif kind == "fork" and sid in log and op[2] not in log:
        log.fork(sid, op[2], at=op[3] % (len(live) + 1))
    elif kind == "override" and live:
        k = op[2] % len(live)
        log.flush(sid, live, overrides={k: op[3]})
    elif kind == "update" and (op[2] or op[3]):
        log.update_session(sid, **op[2], **op[3])
    elif kind == "close" and sid in log:
        log.close_session(sid, reason=op[2])


def live_words(proj: SQLiteProjection, sessions: list[str]) -> dict[str, set[tuple[str, int]]]:
    found: dict[str, set[tuple[str, int]]] = {w: set() for w in WORDS}
    for sid in sessions:
        for row in proj.messages(sid):
            text = " ".join(filter(None, [row["content"], row["tool_text"]]))
            for word in WORDS:
                if word in text.replace('"', " ").replace(":", " ").split():
                    found[word].add((sid, row["position"]))
    return found


@settings(
    max_examples=int(os.environ.get("PROJECTION_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.lists(st.tuples(operation, projection_step), min_size=1, max_size=25),
    st.integers(1, 20),
    st.sampled_from([1, 2, 5, core.ROWS_PER_WRITE]),
)
def test_incremental_with_restarts_equals_rebuild(
    steps: list[tuple[tuple[Any, ...], tuple[Any, ...]]], rebuild_batch: int, rows_per_write: int
) -> None:
    # Small row batches exercise the indexing of bulk rows as they are written, on tiny histories.
    default, core.ROWS_PER_WRITE = core.ROWS_PER_WRITE, rows_per_write
    try:
        check_history(steps, rebuild_batch)
    finally:
        core.ROWS_PER_WRITE = default


def check_history(steps: list[tuple[tuple[Any, ...], tuple[Any, ...]]], rebuild_batch: int) -> None:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        with EventLog.open(tmp / "log", durability="none") as log:
            proj = SQLiteProjection(tmp / "inc.db", batch=5, search_lag=3)
            for op, step in steps:
                run(log, op)
                if step[0] == "catch_up":
                    proj.batch = step[1]
                    proj.catch_up(log)
                elif step[0] == "restart":
                    proj.close()
                    proj = SQLiteProjection(tmp / "inc.db", batch=step[1], search_lag=step[2])
                elif step[0] == "search":
                    proj.search(step[1])
            proj.catch_up(log)
            sessions = log.sessions()
            for sid in sessions:
                rows = proj.messages(sid)
                assert [json.loads(r["message"]) for r in rows] == log.messages(sid)
                assert [r["position"] for r in rows] == list(range(len(rows)))
            expected = live_words(proj, sessions)
            for word in WORDS:
                hits = {(h["session_id"], h["position"]) for h in proj.search(word, limit=10_000)}
                assert hits == expected[word], word
            proj.close()
            with SQLiteProjection(tmp / "full.db", batch=rebuild_batch) as full:
                assert full.rebuild(log) == log.last_seq
            incremental = dump(tmp / "inc.db")
            assert incremental == dump(tmp / "full.db")
            # The search index holds the live rows with text, and nothing else.
            db = sqlite3.connect(tmp / "inc.db")
            with_text = {
                r[0] for r in db.execute("SELECT id FROM live_messages WHERE content != '' OR tool_text != ''")
            }
            db.close()
            assert {entry[1] for entry in incremental["fts"]} == with_text
            db = sqlite3.connect(tmp / "full.db")
            assert sorted(r[0] for r in db.execute("SELECT id FROM sessions")) == sorted(sessions)
            db.close()
