"""Check an event log's proofs and checkpoints offline: the standard library and ``cryptography`` only.

This module imports nothing else from ``eventlog`` (and never LMDB or msgspec), so it can
be copied on its own to wherever proofs are checked and run as a script::

    python verifier.py PROOF.json --key KEY.pub

It holds the verifying half of the audit machinery:

- RFC 9162 Merkle hashing and the verification of inclusion and consistency proofs
  (:func:`verify_inclusion`, :func:`verify_consistency`);
- C2SP signed notes with Ed25519 (:class:`Verifier`, :func:`open_note`) and C2SP
  ``tlog-checkpoint`` bodies (:class:`Checkpoint`);
- the commitments of the log's events and messages (:func:`message_commitment`,
  :func:`event_leaf`), which are salted so that a redacted message leaves nothing
  that confirms a guess of what it said;
- :func:`verify_proof`, which checks a proof written by ``eventlog prove`` from the
  proof alone.

The proof formats are described in ``docs/audit.md``.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import sha256
from typing import Any, Final

EMPTY_ROOT: Final = sha256(b"").digest()
"""The root hash of the empty tree."""

SIGNATURE_ED25519: Final = 1
"""The C2SP signed-note signature type of Ed25519."""

PROOF_FORMAT: Final = "eventlog-proof/v1"
CONSISTENCY_FORMAT: Final = "eventlog-consistency/v1"


class ProofError(ValueError):
    """A proof, note or checkpoint that does not prove what it claims (the message says what failed)."""


# -- RFC 9162 Merkle trees ---------------------------------------------------------


def leaf_hash(data: bytes) -> bytes:
    """The hash of a leaf whose input is ``data``: SHA-256(0x00 || data)."""
    return sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The hash of an interior node: SHA-256(0x01 || left || right)."""
    return sha256(b"\x01" + left + right).digest()


def _bad(h: object) -> bool:
    return not isinstance(h, bytes) or len(h) != 32


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` makes of ``leaf`` at ``index`` in a tree of ``size`` (RFC 9162 2.1.3.2)."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of {size} leaves")
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if _bad(p):
            raise ProofError("a proof hash is not 32 bytes")
        if sn == 0:
            raise ProofError("the proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the proof is shorter than the tree is deep")
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> None:
    """Raise :class:`ProofError` unless ``proof`` shows ``leaf`` at ``index`` in the tree with ``root``."""
    if _bad(leaf) or _bad(root):
        raise ProofError("the leaf and root hashes must be 32 bytes")
    if root_from_inclusion(index, size, leaf, proof) != root:
        raise ProofError(f"the proof does not lead from leaf {index} to the root of the tree of {size} leaves")


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> None:
    """Raise :class:`ProofError` unless ``proof`` shows the ``old``-leaf tree is a prefix of the ``new`` one.

    RFC 9162 2.1.4.2.  As in transparency-dev/merkle, a proof from the empty tree is
    refused: it would prove nothing (the empty tree is a prefix of every tree).
    """
    if not 0 <= old <= new:
        raise ProofError(f"a tree of {old} leaves cannot be a prefix of one of {new}")
    if old == 0:
        raise ProofError("a consistency proof from the empty tree proves nothing")
    if old == new:
        if proof:
            raise ProofError("trees of the same size need an empty proof")
        if old_root != new_root:
            raise ProofError(f"two different roots for the same tree size {old}")
        return
    if not proof:
        raise ProofError("an empty proof between different tree sizes")
    if _bad(old_root) or _bad(new_root):
        raise ProofError("the root hashes must be 32 bytes")
    if any(map(_bad, proof)):
        raise ProofError("a proof hash is not 32 bytes")
    path = list(proof)
    if old & (old - 1) == 0:  # a power of two: the old root is itself a node of the new tree
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the proof is longer than the trees are deep")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the proof is shorter than the trees are deep")
    if fr != old_root:
        raise ProofError(f"the proof does not lead to the old root (tree of {old} leaves)")
    if sr != new_root:
        raise ProofError(f"the proof does not lead to the new root (tree of {new} leaves)")


# -- commitments of events and messages --------------------------------------------

SALT_SIZE: Final = 16
"""Bytes of random salt per stored message (128 bits: a guess cannot be confirmed)."""

_EVENT_DOMAIN = b"eventlog/event/v1\x00"
_NO_OVERRIDE = bytes(32)


def message_commitment(salt: bytes, digest: bytes, override: bytes | None = None) -> bytes:
    """What the log commits to for a stored message: SHA-256("M" || salt || content digest || override digest).

    ``digest`` is SHA-256 of the message's canonical bytes, ``override`` SHA-256 of its
    display override's canonical bytes (None without one).  With the salt erased, the
    commitment says nothing about the content.
    """
    return sha256(b"M" + salt + digest + (override if override is not None else _NO_OVERRIDE)).digest()


def carried_commitment(seq: int, index: int) -> bytes:
    """What the log commits to for a message carried over from message ``index`` of event ``seq``."""
    return sha256(b"C" + struct.pack(">QI", seq, index)).digest()


def appended_commitment(position: int, summaries: int, commitments: Sequence[bytes]) -> bytes:
    """The payload commitment of a messages-appended event, from its messages' commitments."""
    return sha256(b"A" + struct.pack(">QII", position, summaries, len(commitments)) + b"".join(commitments)).digest()


def event_leaf(
    seq: int, time_ns: int, kind: int, number: int, before: int, session: str, payload_commitment: bytes
) -> bytes:
    """The leaf input of event ``seq`` in the log's Merkle tree (its leaf hash is :func:`leaf_hash` of it).

    It covers the event's place (seq, time, kind, session and the session's previous
    event) and its payload commitment, but not the stored bytes themselves, so that
    erasing a message's content (which rewrites those bytes) leaves every leaf as it was.
    """
    name = session.encode("utf-8")
    head = struct.pack(">QQBQQI", seq, time_ns, kind, number, before, len(name))
    return sha256(_EVENT_DOMAIN + head + name + payload_commitment).digest()


# -- C2SP signed notes -------------------------------------------------------------


def key_id(name: str, signature_type: int, public_key: bytes) -> int:
    """The C2SP key ID: the first four bytes of SHA-256(name || 0x0A || type || public key)."""
    return int.from_bytes(sha256(name.encode("utf-8") + b"\n" + bytes([signature_type]) + public_key).digest()[:4])


def check_key_name(name: str) -> None:
    """Raise :class:`ProofError` unless ``name`` may name a note key."""
    if not name or any(c.isspace() or c == "+" for c in name) or any(ord(c) < 0x20 for c in name):
        raise ProofError(f"key name {name!r} must be non-empty, without spaces or '+'")


@dataclass(frozen=True)
class Verifier:
    """An Ed25519 note verifier key, from its C2SP text form ``name+hexid+base64(0x01 || key)``."""

    name: str
    id: int
    public_key: bytes

    @classmethod
    def parse(cls, text: str) -> Verifier:
        parts = text.strip().split("+", 2)  # base64 may hold "+"
        if len(parts) != 3:
            raise ProofError(f"{text.strip()[:80]!r} is not a verifier key (name+id+key)")
        name, hexid, key = parts
        check_key_name(name)
        try:
            raw = base64.b64decode(key, validate=True)
            kid = int(hexid, 16)
        except (binascii.Error, ValueError):
            raise ProofError(f"verifier key {name!r}: the id or key is not hex/base64") from None
        if len(hexid) != 8 or len(raw) != 33 or raw[0] != SIGNATURE_ED25519:
            raise ProofError(f"verifier key {name!r}: not an Ed25519 key")
        if key_id(name, SIGNATURE_ED25519, raw[1:]) != kid:
            raise ProofError(f"verifier key {name!r}: its id does not match its key")
        return cls(name, kid, raw[1:])

    def __str__(self) -> str:
        key = base64.b64encode(bytes([SIGNATURE_ED25519]) + self.public_key).decode()
        return f"{self.name}+{self.id:08x}+{key}"

    def verify(self, message: bytes, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True


@dataclass(frozen=True)
class Signature:
    name: str
    id: int
    signature: bytes


@dataclass(frozen=True)
class Note:
    """A signed note: its ``text`` (ending in a newline) and the signatures that verified."""

    text: str
    verified: tuple[Signature, ...]
    others: tuple[Signature, ...]
    """Signatures by keys not given (ignored, as the note format requires)."""


def split_note(note: str) -> tuple[str, list[Signature]]:
    """The text of a signed note and its signature lines (unchecked)."""
    if not isinstance(note, str):
        raise ProofError("a note is text")
    if any(ord(c) < 0x20 and c != "\n" for c in note):
        raise ProofError("a note must not contain control characters other than newline")
    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise ProofError("not a signed note: no blank line before the signatures, or no final newline")
    text, lines = note[: cut + 1], note[cut + 2 :].split("\n")[:-1]
    if not lines:
        raise ProofError("the note has no signature lines")
    sigs = []
    for line in lines:
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != "—":
            raise ProofError(f"malformed signature line {line[:80]!r}")
        try:
            raw = base64.b64decode(parts[2], validate=True)
        except binascii.Error:
            raise ProofError(f"signature line of {parts[1]!r} is not base64") from None
        if len(raw) < 5:
            raise ProofError(f"signature line of {parts[1]!r} is too short")
        sigs.append(Signature(parts[1], int.from_bytes(raw[:4]), raw[4:]))
    if len(sigs) > 64:
        raise ProofError("the note has more than 64 signatures")
    return text, sigs


def open_note(note: str, verifiers: Iterable[Verifier]) -> Note:
    """Check a signed note against trusted ``verifiers`` (C2SP signed-note rules).

    Signatures by unknown keys are ignored; a signature by a known key that fails
    rejects the note, and so does a note that no known key signed.
    """
    text, sigs = split_note(note)
    known = {(v.name, v.id): v for v in verifiers}
    verified, others = [], []
    for sig in sigs:
        verifier = known.get((sig.name, sig.id))
        if verifier is None:
            others.append(sig)
        elif verifier.verify(text.encode("utf-8"), sig.signature):
            verified.append(sig)
        else:
            raise ProofError(f"the signature of {sig.name!r} does not verify: the note was altered or forged")
    if not verified:
        names = ", ".join(sorted({s.name for s in sigs}))
        raise ProofError(f"no trusted key signed this note (signed by: {names})")
    return Note(text, tuple(verified), tuple(others))


@dataclass(frozen=True)
class Checkpoint:
    """A C2SP ``tlog-checkpoint`` body: origin, tree size, root hash (and extension lines)."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
            raise ProofError("a checkpoint is at least three non-empty lines, each ending in a newline")
        origin, size, root = lines[0], lines[1], lines[2]
        if not size.isdigit() or (size.startswith("0") and size != "0") or not size.isascii():
            raise ProofError(f"checkpoint tree size {size!r} is not a decimal number")
        try:
            digest = base64.b64decode(root, validate=True)
        except binascii.Error:
            digest = b""
        if len(digest) != 32:
            raise ProofError("checkpoint root hash is not 32 bytes of base64")
        return cls(origin, int(size), digest, tuple(lines[3:-1]))

    def text(self) -> str:
        body = [self.origin, str(self.size), base64.b64encode(self.root).decode(), *self.extensions]
        return "\n".join(body) + "\n"


def open_checkpoint(note: str, verifiers: Iterable[Verifier]) -> Checkpoint:
    """The checkpoint in a signed note, once a trusted key's signature verified."""
    return Checkpoint.parse(open_note(note, verifiers).text)


# -- canonical bytes (MessagePack) -------------------------------------------------


def unpack(data: bytes) -> Any:
    """Decode the MessagePack of a stored message (JSON-like values only)."""
    value, end = _unpack(data, 0)
    if end != len(data):
        raise ProofError("trailing bytes after the message")
    return value


def _unpack(b: bytes, i: int) -> tuple[Any, int]:
    try:
        t = b[i]
        i += 1
        if t <= 0x7F:
            return t, i
        if t >= 0xE0:
            return t - 0x100, i
        if 0xA0 <= t <= 0xBF:
            return _text(b, i, t & 0x1F)
        if 0x90 <= t <= 0x9F:
            return _array(b, i, t & 0x0F)
        if 0x80 <= t <= 0x8F:
            return _map(b, i, t & 0x0F)
        if t == 0xC0:
            return None, i
        if t in (0xC2, 0xC3):
            return t == 0xC3, i
        fixed = _FIXED.get(t)
        if fixed is not None:
            fmt, size = fixed
            return struct.unpack_from(fmt, b, i)[0], i + size
        if t in (0xD9, 0xDA, 0xDB):
            size = 1 << (t - 0xD9)
            return _text(b, i + size, int.from_bytes(b[i : i + size]))
        if t in (0xDC, 0xDD):
            size = 2 if t == 0xDC else 4
            return _array(b, i + size, int.from_bytes(b[i : i + size]))
        if t in (0xDE, 0xDF):
            size = 2 if t == 0xDE else 4
            return _map(b, i + size, int.from_bytes(b[i : i + size]))
    except (IndexError, struct.error, UnicodeDecodeError) as e:
        raise ProofError(f"the message bytes are not valid MessagePack ({e})") from None
    raise ProofError(f"the message bytes hold a MessagePack type 0x{t:02x} that messages never use")


_FIXED = {
    0xCA: (">f", 4),
    0xCB: (">d", 8),
    0xCC: (">B", 1),
    0xCD: (">H", 2),
    0xCE: (">I", 4),
    0xCF: (">Q", 8),
    0xD0: (">b", 1),
    0xD1: (">h", 2),
    0xD2: (">i", 4),
    0xD3: (">q", 8),
}


def _text(b: bytes, i: int, n: int) -> tuple[str, int]:
    if i + n > len(b):
        raise IndexError("string runs past the end")
    return b[i : i + n].decode("utf-8"), i + n


def _array(b: bytes, i: int, n: int) -> tuple[list[Any], int]:
    out = []
    for _ in range(n):
        value, i = _unpack(b, i)
        out.append(value)
    return out, i


def _map(b: bytes, i: int, n: int) -> tuple[dict[str, Any], int]:
    out = {}
    for _ in range(n):
        key, i = _unpack(b, i)
        if not isinstance(key, str):
            raise ProofError("a message map key is not a string")
        out[key], i = _unpack(b, i)
    return out, i


# -- proofs ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProvenMessage:
    """What a verified message proof established."""

    session: str
    position: int
    seq: int
    message: Any
    checkpoint: Checkpoint


def _hex(value: Any, what: str, size: int = 32) -> bytes:
    try:
        raw = bytes.fromhex(value)
    except (TypeError, ValueError):
        raise ProofError(f"{what} is not hex") from None
    if len(raw) != size:
        raise ProofError(f"{what} is not {size} bytes")
    return raw


def _int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProofError(f"{what} is not a non-negative integer")
    return value


def _get(mapping: Any, key: str, what: str) -> Any:
    if not isinstance(mapping, Mapping) or key not in mapping:
        raise ProofError(f"the proof has no {what}")
    return mapping[key]


def verify_proof(proof: Mapping[str, Any], verifiers: Iterable[Verifier]) -> ProvenMessage:
    """Check a message proof (``eventlog prove``) from the proof alone; raise :class:`ProofError` if it fails.

    The chain of checks: the message's canonical bytes hash to its content digest;
    salt, digest and override digest give its commitment; with the event's other
    commitments that gives the event's leaf; the inclusion path leads from the leaf
    to the root of the checkpoint; a trusted key signed the checkpoint.
    """
    verifiers = list(verifiers)
    if _get(proof, "format", "format") != PROOF_FORMAT:
        raise ProofError(f"not a message proof (format {proof.get('format')!r}, expected {PROOF_FORMAT!r})")
    checkpoint = open_checkpoint(_get(proof, "checkpoint", "checkpoint"), verifiers)
    event = _get(proof, "event", "event")
    message = _get(proof, "message", "message")
    seq = _int(_get(event, "seq", "event seq"), "event seq")
    index = _int(_get(message, "index", "message index"), "message index")
    canonical = base64.b64decode(_get(message, "canonical", "message canonical bytes"), validate=True)
    salt = _hex(_get(message, "salt", "message salt"), "message salt", SALT_SIZE)
    override = message.get("override_canonical")
    override_digest = sha256(base64.b64decode(override, validate=True)).digest() if override is not None else None
    digest = sha256(canonical).digest()
    decoded = unpack(canonical)
    if "content" in message and json.loads(json.dumps(message["content"])) != json.loads(json.dumps(decoded)):
        raise ProofError("the message shown is not the message its canonical bytes hold")
    commitments = [
        _hex(c, f"commitment {i}") if c is not None else None
        for i, c in enumerate(_get(event, "commitments", "commitments"))
    ]
    if index >= len(commitments) or commitments[index] is not None:
        raise ProofError("the event's commitments must leave the proven message's own place empty (null)")
    commitments[index] = message_commitment(salt, digest, override_digest)
    payload = appended_commitment(
        _int(_get(event, "position", "event position"), "event position"),
        _int(event.get("summaries", 0), "summaries"),
        [c for c in commitments if c is not None],
    )
    session = _get(event, "session", "event session")
    if not isinstance(session, str):
        raise ProofError("the event session is not a string")
    leaf = event_leaf(
        seq,
        _int(_get(event, "time_ns", "event time"), "event time"),
        _int(_get(event, "kind", "event kind"), "event kind"),
        _int(_get(event, "number", "session number"), "session number"),
        _int(_get(event, "before", "session's previous event"), "session's previous event"),
        session,
        payload,
    )
    path = [_hex(h, "inclusion hash") for h in _get(proof, "inclusion", "inclusion path")]
    if seq < 1 or seq > checkpoint.size:
        raise ProofError(f"event {seq} is not in the checkpoint's tree of {checkpoint.size} events")
    verify_inclusion(seq - 1, checkpoint.size, leaf_hash(leaf), path, checkpoint.root)
    return ProvenMessage(session, event["position"] + index, seq, decoded, checkpoint)


def verify_consistency_proof(proof: Mapping[str, Any], verifiers: Iterable[Verifier]) -> tuple[Checkpoint, Checkpoint]:
    """Check a consistency proof between two signed checkpoints (``eventlog prove --consistency``)."""
    verifiers = list(verifiers)
    if _get(proof, "format", "format") != CONSISTENCY_FORMAT:
        raise ProofError(f"not a consistency proof (format {proof.get('format')!r})")
    old = open_checkpoint(_get(proof, "old", "old checkpoint"), verifiers)
    new = open_checkpoint(_get(proof, "new", "new checkpoint"), verifiers)
    if old.origin != new.origin:
        raise ProofError(f"the checkpoints are of different logs ({old.origin!r}, {new.origin!r})")
    path = [_hex(h, "consistency hash") for h in _get(proof, "consistency", "consistency path")]
    verify_consistency(old.size, new.size, old.root, new.root, path)
    return old, new


def verify_file(path: str, keys: Sequence[str]) -> str:
    """Check the proof in file ``path`` with the verifier keys in files ``keys``; a one-line summary."""
    with open(path, encoding="utf-8") as handle:
        try:
            proof = json.load(handle)
        except json.JSONDecodeError as e:
            raise ProofError(f"{path}: not JSON ({e})") from None
    verifiers = []
    for key in keys:
        with open(key, encoding="utf-8") as handle:
            verifiers.append(Verifier.parse(handle.read()))
    if isinstance(proof, Mapping) and proof.get("format") == CONSISTENCY_FORMAT:
        old, new = verify_consistency_proof(proof, verifiers)
        return f"ok: {old.origin} at {old.size} events is a prefix of the log at {new.size} events"
    proven = verify_proof(proof, verifiers)
    return (
        f"ok: message {proven.position} of session {proven.session!r} (event {proven.seq}) "
        f"is in {proven.checkpoint.origin} at {proven.checkpoint.size} events"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python verifier.py PROOF --key KEY.pub [--key ...]``: exit 0 when the proof holds."""
    import argparse

    parser = argparse.ArgumentParser(description="Check an eventlog proof offline.")
    parser.add_argument("proof")
    parser.add_argument("--key", action="append", required=True, help="a verifier key file (repeatable)")
    args = parser.parse_args(argv)
    try:
        print(verify_file(args.proof, args.key))
    except (ProofError, OSError) as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
