"""Checkpoints, message and consistency proofs, and their offline verification (library and CLI)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import assistant, user

from eventlog import EventLog, codec, signing
from eventlog.audit import AuditError
from eventlog.cli import cli
from eventlog.verifier import ProofError, open_checkpoint, verify_consistency_proof, verify_proof

VERIFIER = Path(__file__).resolve().parent.parent / "eventlog" / "verifier.py"


def run(log: Path, *args: str):
    return CliRunner().invoke(cli, ["--log", str(log), *args], catch_exceptions=False)


@pytest.fixture
def key():
    return signing.generate("example.com/agent-log")


def test_flush_result_carries_the_seq_of_its_last_event(tmp_path):
    with EventLog.open(tmp_path / "log") as log:
        first = log.flush("chat", [user("hi"), assistant("hello")])
        assert first.seq == log.last_seq == 2  # opened, then appended
        again = log.flush("chat", [user("hi"), assistant("hello")])
        assert again.seq == 0  # nothing written
        rewound = log.rewind("chat", to=1)
        assert rewound.seq == log.last_seq == 3
        appended = log.append("chat", [assistant("hey")])
        assert appended.seq == log.last_seq == 4


def test_a_message_proof_verifies_offline_and_a_changed_byte_does_not(tmp_path, key):
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi"), assistant("hello", name="bot")], overrides={1: {"display": "Hello!"}})
        log.flush("other", [user("unrelated")])
        note = log.checkpoint([key])
        assert log.checkpoints() == [note]
        proof = log.prove("chat", 1, note)
    proven = verify_proof(proof, [key.verifier()])
    assert (proven.session, proven.position, proven.message) == ("chat", 1, assistant("hello", name="bot"))
    assert proven.checkpoint.size == 4
    text = json.dumps(proof)
    assert text.count('"hello"') == 1
    with pytest.raises(ProofError, match="not the message its canonical bytes hold"):
        verify_proof(json.loads(text.replace('"hello"', '"hullo"')), [key.verifier()])
    tampered = json.loads(text)
    tampered["message"]["canonical"] = base64.b64encode(codec.encode(assistant("hullo", name="bot"))).decode()
    tampered["message"]["content"] = assistant("hullo", name="bot")
    with pytest.raises(ProofError, match="does not lead"):
        verify_proof(tampered, [key.verifier()])
    tampered = json.loads(text)
    tampered["message"]["override_canonical"] = base64.b64encode(codec.encode({"display": "Hi!"})).decode()
    with pytest.raises(ProofError, match="does not lead"):
        verify_proof(tampered, [key.verifier()])
    tampered = json.loads(text)
    tampered["event"]["time_ns"] -= 1  # backdated
    with pytest.raises(ProofError, match="does not lead"):
        verify_proof(tampered, [key.verifier()])
    tampered = json.loads(text)
    tampered["message"]["salt"] = "00" * 16
    with pytest.raises(ProofError, match="does not lead"):
        verify_proof(tampered, [key.verifier()])
    with pytest.raises(ProofError, match="no trusted key"):
        verify_proof(proof, [signing.generate("example.com/agent-log").verifier()])


def test_a_carried_message_is_proven_in_the_event_that_holds_its_body(tmp_path, key):
    with EventLog.open(tmp_path / "log") as log:
        chat = [user("a"), assistant("b"), user("c")]
        log.flush("chat", chat)
        log.flush("chat", [chat[0], assistant("edited"), chat[2]])  # c is carried, not stored again
        note = log.checkpoint([key])
        proof = log.prove("chat", 2, note)
    assert proof["event"]["seq"] == 2
    assert verify_proof(proof, [key.verifier()]).message == user("c")


def test_proofs_refuse_what_they_cannot_prove(tmp_path, key):
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi")])
        early = log.checkpoint([key])
        log.flush("chat", [user("hi"), assistant("later")])
        with pytest.raises(AuditError, match="after the checkpoint"):
            log.prove("chat", 1, early)
        with pytest.raises(AuditError, match="no position 5"):
            log.prove("chat", 5, early)
        with pytest.raises(AuditError, match="not a checkpoint"):
            log.prove("chat", 0, "hello\n")
    with EventLog.open(tmp_path / "other") as other:
        other.flush("x", [user("hi"), user("there")])
        with pytest.raises(AuditError, match="not this log's"):
            other.prove("x", 0, early)


def test_consistency_proofs_between_checkpoints(tmp_path, key):
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi")])
        old = log.checkpoint([key])
        for i in range(7):
            log.flush("chat", [user("hi")] + [assistant(str(j)) for j in range(i + 1)])
        new = log.checkpoint([key])
        proof = log.prove_consistency(old, new)
    first, second = verify_consistency_proof(proof, [key.verifier()])
    assert (first.size, second.size) == (2, 9)
    swapped = dict(proof, old=new, new=old)
    with pytest.raises(ProofError):
        verify_consistency_proof(swapped, [key.verifier()])


def test_the_cli_round_trip_and_the_stand_alone_verifier(tmp_path):
    log, keyfile = tmp_path / "log", tmp_path / "keys" / "signer"
    keyfile.parent.mkdir()
    with EventLog.open(log) as opened:
        opened.flush("chat", [user("hi"), assistant("hello")])
    made = run(log, "keygen", "--out", str(keyfile), "--name", "example.com/agent-log")
    assert made.exit_code == 0, made.output
    assert (tmp_path / "keys" / "signer.pub").read_text().startswith("example.com/agent-log+")
    inside = run(log, "keygen", "--out", str(log / "key"))
    assert inside.exit_code == 1 and "must not live inside the log directory" in inside.output
    cp = tmp_path / "cp.txt"
    signed = run(log, "checkpoint", "--key", str(keyfile), "--out", str(cp))
    assert signed.exit_code == 0, signed.output
    assert signed.stdout == cp.read_text() and signed.stdout.splitlines()[1] == "2"
    proof = tmp_path / "proof.json"
    assert run(log, "prove", "chat", "1", "--checkpoint", str(cp), "--out", str(proof)).exit_code == 0
    pub = str(keyfile) + ".pub"
    checked = run(log, "verify-proof", str(proof), "--key", pub)
    assert checked.exit_code == 0 and "message 1 of session 'chat' (event 2)" in checked.stdout
    assert run(log, "verify", "--checkpoint", str(cp), "--key", pub).exit_code == 0
    # Stand-alone: the verifier file alone, with eventlog, lmdb and msgspec unimportable.
    script = (
        "import sys, runpy\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('eventlog', 'lmdb', 'msgspec'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"sys.argv = ['verifier.py', {str(proof)!r}, '--key', {pub!r}]\n"
        f"runpy.run_path({str(VERIFIER)!r}, run_name='__main__')\n"
    )
    alone = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.startswith("ok: message 1 of session 'chat'")
    data = json.loads(proof.read_text())
    data["message"]["canonical"] = data["message"]["canonical"][:-4] + "AAA="
    proof.write_text(json.dumps(data))
    bad = run(log, "verify-proof", str(proof), "--key", pub)
    assert bad.exit_code == 1 and "FAILED" in bad.stderr
    with EventLog.open(log) as opened:
        opened.flush("chat", [user("hi"), assistant("hello"), user("more")])
    cp2 = tmp_path / "cp2.txt"
    assert run(log, "checkpoint", "--key", str(keyfile), "--out", str(cp2)).exit_code == 0
    consistency = tmp_path / "consistency.json"
    assert run(log, "prove", "--consistency", str(cp), str(cp2), "--out", str(consistency)).exit_code == 0
    assert run(log, "verify-proof", str(consistency), "--key", pub).exit_code == 0
    usage = CliRunner().invoke(cli, ["--log", str(log), "verify", "--checkpoint", str(cp)])
    assert usage.exit_code == 2 and "--checkpoint needs --key" in usage.output


def test_an_external_signer_command_signs_checkpoints(tmp_path):
    log, keyfile = tmp_path / "log", tmp_path / "signer"
    with EventLog.open(log) as opened:
        opened.flush("chat", [user("hi")])
    signing.write_keys(signing.generate("example.com/hsm"), keyfile)
    script = tmp_path / "sign.py"
    script.write_text(
        "import sys\nfrom eventlog.signing import KeySigner, sign_note\n"
        f"print(sign_note(sys.stdin.read(), [KeySigner.load({str(keyfile)!r})]).splitlines()[-1])\n"
    )
    result = run(log, "checkpoint", "--signer", f"{sys.executable} {script}", "--signer-key", str(keyfile) + ".pub")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith("— example.com/hsm ")


def test_a_second_key_cosigns_the_checkpoint_at_the_same_size(tmp_path, key):
    """Key rotation: the stored note carries both signatures; each key alone verifies it."""
    new_key = signing.generate("example.com/agent-log-2")
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi")])
        log.checkpoint([key])
        both = log.checkpoint([new_key])
        assert log.checkpoints() == [both]
    assert [line.split(" ")[1] for line in both.splitlines() if line.startswith("—")] == [
        "example.com/agent-log",
        "example.com/agent-log-2",
    ]
    for verifier in (key.verifier(), new_key.verifier()):
        assert open_checkpoint(both, [verifier]).size == 2
