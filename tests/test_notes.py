"""Signed notes and checkpoints, against the C2SP and Go note test vectors."""

from __future__ import annotations

import base64
import sys

import pytest

from eventlog import signing
from eventlog.signing import CommandSigner, KeySigner, SigningError, sign_note
from eventlog.verifier import Checkpoint, ProofError, Verifier, open_checkpoint, open_note

# c2sp.org/signed-note, "Verifier keys / Example": this key verifies this note.
C2SP_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
C2SP_NOTE = (
    "This is an example message.\n\n"
    "— example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
)
# golang.org/x/mod/sumdb/note, ExampleSign / ExampleOpen (Ed25519 signatures are deterministic).
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_NOTE = (
    GO_TEXT
    + "\n— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def test_the_c2sp_example_note_verifies_with_its_key():
    note = open_note(C2SP_NOTE, [Verifier.parse(C2SP_VKEY)])
    assert note.text == "This is an example message.\n"
    assert [s.name for s in note.verified] == ["example.com/foo"]
    with pytest.raises(ProofError, match="does not verify"):
        open_note(C2SP_NOTE.replace("example message", "exemplary message"), [Verifier.parse(C2SP_VKEY)])


def test_our_signer_reproduces_the_go_note_signature_byte_for_byte():
    signer = KeySigner.parse(GO_SKEY)
    assert str(signer.verifier()) == GO_VKEY
    assert str(signer) == GO_SKEY
    assert sign_note(GO_TEXT, [signer]) == GO_NOTE
    assert open_note(GO_NOTE, [Verifier.parse(GO_VKEY)]).text == GO_TEXT


def test_unknown_keys_are_ignored_but_a_note_needs_one_trusted_signature():
    other = signing.generate("example.com/other")
    cosigned = sign_note(GO_TEXT, [other], existing=GO_NOTE)
    note = open_note(cosigned, [Verifier.parse(GO_VKEY)])
    assert [s.name for s in note.others] == ["example.com/other"]
    with pytest.raises(ProofError, match="no trusted key signed"):
        open_note(GO_NOTE, [other.verifier()])


@pytest.mark.parametrize(
    "bad",
    [
        "example.com/foo+530d903b+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",  # id does not match
        "example.com/foo+530d903a+AkyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",  # not base64 of 33 bytes
        "example.com foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",  # space in the name
        "example.com/foo+530d903a",
    ],
)
def test_malformed_verifier_keys_are_refused(bad):
    with pytest.raises(ProofError):
        Verifier.parse(bad)


def test_checkpoint_body_round_trips_and_rejects_malformed_text():
    cp = Checkpoint("example.com/log", 20852163, bytes(range(32)))
    assert Checkpoint.parse(cp.text()) == cp
    assert cp.text().splitlines()[1] == "20852163"
    for text in ("a\n01\n" + base64.b64encode(bytes(32)).decode() + "\n", "a\n1\nAAAA\n", "a\n1\n"):
        with pytest.raises(ProofError):
            Checkpoint.parse(text)
    signer = signing.generate("example.com/log")
    note = sign_note(cp.text(), [signer])
    assert open_checkpoint(note, [signer.verifier()]) == cp


def test_keys_are_written_once_private_mode_and_read_back(tmp_path):
    signer = signing.generate("example.com/log")
    private, public = signing.write_keys(signer, tmp_path / "k")
    assert (tmp_path / "k").stat().st_mode & 0o077 == 0
    assert KeySigner.load(private).seed == signer.seed
    assert Verifier.parse((tmp_path / "k.pub").read_text()) == signer.verifier()
    with pytest.raises(SigningError, match="exists"):
        signing.write_keys(signer, tmp_path / "k")
    with pytest.raises(SigningError, match="not a private key"):
        KeySigner.load(public)
    assert signer.seed.hex() not in repr(signer)


def test_an_external_command_can_sign(tmp_path):
    signer = signing.generate("example.com/log")
    key = tmp_path / "k"
    signing.write_keys(signer, key)
    script = tmp_path / "sign.py"
    script.write_text(
        "import sys\n"
        "from eventlog.signing import KeySigner, sign_note\n"
        f"s = KeySigner.load({str(key)!r})\n"
        "text = sys.stdin.read()\n"
        "print(sign_note(text, [s]).splitlines()[-1])\n"
    )
    command = CommandSigner(f"{sys.executable} {script}", signer.verifier())
    note = sign_note(GO_TEXT, [command])
    assert note == sign_note(GO_TEXT, [signer])
    wrong = CommandSigner(f"{sys.executable} {script}", signing.generate("example.com/log").verifier())
    with pytest.raises(SigningError, match="another key"):
        sign_note(GO_TEXT, [wrong])
    failing = CommandSigner(f"{sys.executable} -c 'import sys; sys.exit(3)'", signer.verifier())
    with pytest.raises(SigningError, match="exited 3"):
        sign_note(GO_TEXT, [failing])
