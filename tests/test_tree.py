"""The log's Merkle tree: kept in the commit, equal to a rebuild, checked by verify, added by the upgrade."""

from __future__ import annotations

import threading

import lmdb
import msgspec
import pytest
from factories import assistant, user

from eventlog import EventLog, merkle
from eventlog import events as ev
from eventlog.errors import ConflictError
from eventlog.keys import HEADER, SEQ, STATE, SessionState, event_hash, state_key
from eventlog.tree import AppendedLeaf, _leaf_decoder, commitments, leaf_input, salt_of
from eventlog.verifier import message_commitment


def busy_log(log: EventLog) -> None:
    chat = [user("hi"), assistant("hello"), user("how are you?"), assistant("fine")]
    log.flush("chat", chat)
    log.flush("chat", chat[:2])  # rewind
    log.flush("chat", chat[:2] + [user("edited")], overrides={2: {"display": "clean"}})
    log.fork("chat", "fork", at=1)
    log.flush("fork", [chat[0], assistant("another answer")])
    log.compact("chat", start=0, end=2, summary=[user("summary")])
    log.update_session("chat", title="t", input_tokens=3)
    log.close_session("fork", reason="done")


def leaves_of(log: EventLog) -> list[bytes]:
    store = log._store
    with store.read() as txn:
        return [merkle.leaf_hash(leaf_input(seq, store.raw_event(txn, seq))) for seq in range(1, log.last_seq + 1)]


def tree_of(log: EventLog) -> dict[bytes, bytes]:
    store = log._store
    with store.read() as txn:
        return dict(store.tree.nodes(txn))


def test_the_tree_has_a_leaf_per_event_and_the_root_of_the_events(tmp_path):
    with EventLog.open(tmp_path / "log") as log:
        busy_log(log)
        store = log._store
        with store.read() as txn:
            size, root = store.tree.root(txn)
        assert size == log.last_seq > 8
        assert root == merkle.root(leaves_of(log))
        # Every prefix root is there too (what a checkpoint at that size would sign).
        with store.read() as txn:
            for n in range(1, size + 1):
                assert store.tree.root(txn, n)[1] == merkle.root(leaves_of(log)[:n])
        assert log.verify().ok


def test_the_incremental_tree_equals_one_rebuilt_from_the_events(tmp_path):
    with EventLog.open(tmp_path / "log") as log:
        busy_log(log)
        before = tree_of(log)
        log._store.write(log._store.tree.rebuild)
        assert tree_of(log) == before
        # About two nodes per event, every one keyed at the tree's right edge when it was written.
        assert len(before) < 2 * log.last_seq
        assert list(before) == sorted(before)


def test_concurrent_group_commits_keep_one_tree(tmp_path):
    with EventLog.open(tmp_path / "log", durability="none") as log:

        def work(i: int) -> None:
            messages = []
            for j in range(15):
                messages.append(user(f"{i}/{j}"))
                log.flush(f"s{i}", messages)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with log._store.read() as txn:
            assert log._store.tree.root(txn) == (log.last_seq, merkle.root(leaves_of(log)))
        assert log.verify().ok


def test_verify_finds_a_damaged_or_missing_tree_node(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        busy_log(log)
        nodes = tree_of(log)
    key = sorted(nodes)[len(nodes) // 2]
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(key, bytes(32), db=env.open_db(b"tree", txn=txn))
    env.close()
    with EventLog.open(path, readonly=True) as log:
        report = log.verify()
        assert not report.ok
        assert "the Merkle tree differs from the events" in str(report.problems)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(key, nodes[key], db=env.open_db(b"tree", txn=txn))
        txn.put(SEQ.pack(10**6) + b"\x00", bytes(32), db=env.open_db(b"tree", txn=txn))
    env.close()
    with EventLog.open(path, readonly=True) as log:
        assert "tree: nodes beyond the" in str(log.verify().problems)


def downgrade_to_format_1(path) -> None:
    """Turn a log into what the first format wrote: no salts, no tree, format b"1"."""
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        events, meta, index = (env.open_db(n, txn=txn) for n in (b"events", b"meta", b"index"))
        prev = bytes(32)
        last: dict[int, bytes] = {}
        for key, raw in list(txn.cursor(db=events)):
            _, t, kind, number, before = HEADER.unpack_from(raw)
            event = ev.decoder.decode(raw[HEADER.size :])
            if isinstance(event, ev.MessagesAppended):
                event = msgspec.structs.replace(event, salts=b"")
            elif isinstance(event, ev.MessageAnnotated):
                event = msgspec.structs.replace(event, salt=b"")
            raw = HEADER.pack(prev, t, kind, number, before) + ev.encoder.encode(event)
            txn.put(key, raw, db=events)
            prev = last[number] = event_hash(SEQ.unpack(key)[0], raw)
        for number, digest in last.items():
            state = SessionState.unpack(number, txn.get(state_key(number), db=index))
            state.last_hash = digest
            txn.put(state_key(number), state.pack(), db=index)
            assert len(state.pack()) == STATE.size
        txn.drop(env.open_db(b"tree", txn=txn), delete=True)
        txn.drop(env.open_db(b"checkpoints", txn=txn), delete=True)
        txn.put(b"format", b"1", db=meta)
    env.close()


def test_a_format_1_log_is_upgraded_when_first_opened_for_writing(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        busy_log(log)
        transcripts = {s: log.messages(s) for s in log.sessions()}
        heads = {s: log.head(s) for s in log.sessions()}
    downgrade_to_format_1(path)
    with EventLog.open(path, readonly=True) as log:  # read-only: read as before, no tree to check
        assert {s: log.messages(s) for s in log.sessions()} == transcripts
        report = log.verify()
        assert [p.what for p in report.problems] == [
            "tree: the log predates its Merkle tree (format 1); run `eventlog migrate`"
        ]
    with EventLog.open(path) as log:
        assert log.verify().ok, log.verify().problems
        assert {s: log.messages(s) for s in log.sessions()} == transcripts
        assert {s: log.head(s) for s in log.sessions()} == heads  # content and node digests unchanged
        with log._store.read() as txn:
            assert log._store.tree.root(txn) == (log.last_seq, merkle.root(leaves_of(log)))
        for record in log.events():
            if isinstance(record.event, ev.MessagesAppended):
                assert len(record.event.salts) == 16 * len(record.event)
        log.flush("chat", log.messages("chat") + [user("after the upgrade")])
        assert log.verify().ok


def test_the_leaves_commit_to_salted_content_only(tmp_path):
    """The same event without its salts commits to something else: the salt is in every leaf."""
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("my card is 4111 1111 1111 1111")])
        store = log._store
        with store.read() as txn:
            raw = bytes(store.raw_event(txn, 2))
    event = ev.decoder.decode(raw[HEADER.size :])
    assert isinstance(event, ev.MessagesAppended) and len(event.salts) == 16
    unsalted = raw[: HEADER.size] + ev.encoder.encode(msgspec.structs.replace(event, salts=bytes(16)))
    assert leaf_input(2, raw) != leaf_input(2, unsalted)


def test_eventlog_migrate_upgrades_in_place_and_says_so(tmp_path):
    from click.testing import CliRunner

    from eventlog.cli import cli

    path = tmp_path / "log"
    with EventLog.open(path) as log:
        busy_log(log)
        events = log.last_seq
    downgrade_to_format_1(path)
    assert EventLog.format_of(path) == "1"
    result = CliRunner().invoke(cli, ["--log", str(path), "migrate"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"upgraded from format 1 to 2: {events} events in the tree"
    assert EventLog.format_of(path) == "2"
    again = CliRunner().invoke(cli, ["--log", str(path), "migrate"], catch_exceptions=False)
    assert again.stdout.strip() == f"already at format 2: {events} events in the tree"
    assert CliRunner().invoke(cli, ["--log", str(path), "verify"]).exit_code == 0
    missing = CliRunner().invoke(cli, ["--log", str(tmp_path / "nothing"), "migrate"])
    assert missing.exit_code == 1 and "no event log" in missing.output


def test_the_tree_reads_an_append_as_a_full_read_does_without_its_bodies(tmp_path):
    """The tree decodes an append without its bodies: every other field is read, and every leaf
    is the one the whole event gives, for plain appends and for carried, overridden and
    summarised messages; each plain message's commitment is its salted content digest."""
    fields = {f.name: f.default for f in msgspec.structs.fields(ev.MessagesAppended)}
    light = {f.name: f.default for f in msgspec.structs.fields(AppendedLeaf)}
    assert light == {name: default for name, default in fields.items() if name not in ("bodies", "nodes")}
    with EventLog.open(tmp_path / "log") as log:
        busy_log(log)
        log.flush("bulk", [user(f"message {i} \u00e9\U0001f600") for i in range(300)])
        store = log._store
        plain = 0
        with store.read() as txn:
            for seq in range(1, log.last_seq + 1):
                raw = bytes(store.raw_event(txn, seq))
                event = ev.decoder.decode(raw[HEADER.size :])
                assert leaf_input(seq, raw) == leaf_input(seq, raw, event)
                if isinstance(event, ev.MessagesAppended) and not (event.carried or event.overrides):
                    plain += 1
                    expected = [message_commitment(salt_of(event, i), event.digest(i)) for i in range(len(event))]
                    assert commitments(event) == expected
                    assert commitments(_leaf_decoder.decode(raw[HEADER.size :])) == expected
        assert plain >= 3
        assert log.verify().ok


def test_a_leaf_noted_by_a_write_that_was_undone_is_never_taken(tmp_path):
    """The tree takes the leaves a write noted for its events only where the hashes vouch for them:
    a flush_many refused after one session's append was written leaves a noted leaf for that
    seq, and the next write's event there is another one, read back from the log."""
    with EventLog.open(tmp_path / "log", durability="none") as log:
        log.flush("a", [user("one")])
        log.flush("b", [user("two")])
        head_b = log.head("b")
        log.flush("b", [user("two"), assistant("moved on")])
        bulk = [user(f"message {i}") for i in range(50)]
        with pytest.raises(ConflictError):  # a's append is written, then b's stale head refuses all
            log.flush_many({"a": [user("one"), *bulk], "b": [user("two"), user("x")]}, expected_heads={"b": head_b})
        noted = dict(log._store.tree._emitted)
        assert log.last_seq + 1 in noted  # the undone append's leaf, at the seq the next event takes
        log.update_session("a", title="next")  # that seq is now this event (one the writer notes nothing for)
        before = tree_of(log)
        log._store.write(log._store.tree.rebuild)
        assert tree_of(log) == before
        assert log.verify().ok
