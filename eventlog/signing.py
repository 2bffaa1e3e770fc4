"""Signing checkpoints: Ed25519 keys in the C2SP signed-note formats, or an external signer.

Needs the ``cryptography`` package (``pip install 'agent-eventlog[audit]'``), imported
only when a key is made or used.  Key files use the text forms of Go's
``golang.org/x/mod/sumdb/note`` package, which other note tools read too:

- the signer key ``PRIVATE+KEY+<name>+<key id>+base64(0x01 || 32-byte seed)``;
- the verifier key ``<name>+<key id>+base64(0x01 || 32-byte public key)``.

An external signer is a command that reads the note text on stdin and prints the
signature line's base64 (key id and signature) or the whole signature line; the
private key then never leaves the signer (an HSM, a KMS, another host).
"""

from __future__ import annotations

import base64
import binascii
import os
import shlex
import subprocess
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

from .errors import EventLogError
from .verifier import SIGNATURE_ED25519, ProofError, Verifier, check_key_name, key_id, split_note

PRIVATE_PREFIX = "PRIVATE+KEY+"


class SigningError(EventLogError):
    """A key that cannot be read or used, or a signer that failed."""


class Signer(Protocol):
    """Signs note text for one key: what :func:`sign_note` needs."""

    @property
    def name(self) -> str: ...

    @property
    def id(self) -> int: ...

    def sign(self, message: bytes) -> bytes: ...


def _crypto() -> ModuleType:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - the extra is installed by the test suite
        raise SigningError("signing needs the cryptography package: pip install 'agent-eventlog[audit]'") from None
    return ed25519


@dataclass(frozen=True)
class KeySigner:
    """An Ed25519 signer from a private key text (``PRIVATE+KEY+name+id+key``)."""

    name: str
    id: int
    seed: bytes

    @classmethod
    def parse(cls, text: str, *, where: str = "the key") -> KeySigner:
        text = text.strip()
        if not text.startswith(PRIVATE_PREFIX):
            raise SigningError(f"{where}: not a private key (it starts with {PRIVATE_PREFIX!r})")
        parts = text[len(PRIVATE_PREFIX) :].split("+", 2)  # base64 may hold "+"
        if len(parts) != 3:
            raise SigningError(f"{where}: a private key is PRIVATE+KEY+name+id+key")
        name, hexid, key = parts
        try:
            raw = base64.b64decode(key, validate=True)
            kid = int(hexid, 16)
        except (binascii.Error, ValueError):
            raise SigningError(f"{where}: the key id or key is not hex/base64") from None
        if len(raw) != 33 or raw[0] != SIGNATURE_ED25519:
            raise SigningError(f"{where}: not an Ed25519 key")
        signer = cls(name, kid, raw[1:])
        if key_id(name, SIGNATURE_ED25519, signer.public_key()) != kid:
            raise SigningError(f"{where}: the key id does not match the key")
        return signer

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeySigner:
        try:
            with open(path, encoding="utf-8") as handle:
                return cls.parse(handle.read(), where=os.fspath(path))
        except OSError as e:
            raise SigningError(f"{os.fspath(path)}: cannot read the key ({e.strerror})") from None

    def public_key(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        key = _crypto().Ed25519PrivateKey.from_private_bytes(self.seed).public_key()
        return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def verifier(self) -> Verifier:
        return Verifier(self.name, self.id, self.public_key())

    def sign(self, message: bytes) -> bytes:
        return bytes(_crypto().Ed25519PrivateKey.from_private_bytes(self.seed).sign(message))

    def __str__(self) -> str:
        key = base64.b64encode(bytes([SIGNATURE_ED25519]) + self.seed).decode()
        return f"{PRIVATE_PREFIX}{self.name}+{self.id:08x}+{key}"

    def __repr__(self) -> str:  # never print the seed by accident
        return f"KeySigner(name={self.name!r}, id={self.id:08x})"


def generate(name: str) -> KeySigner:
    """A new random Ed25519 signer named ``name`` (a schema-less URL such as ``example.com/agent-log``)."""
    try:
        check_key_name(name)
    except ProofError as e:
        raise SigningError(str(e)) from None
    seed = os.urandom(32)
    from cryptography.hazmat.primitives import serialization

    public = (
        _crypto()
        .Ed25519PrivateKey.from_private_bytes(seed)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    return KeySigner(name, key_id(name, SIGNATURE_ED25519, public), seed)


def write_keys(signer: KeySigner, path: str | os.PathLike[str]) -> tuple[str, str]:
    """Write the private key to ``path`` (mode 0600, never over an existing file) and the verifier key to ``path.pub``."""
    private, public = os.fspath(path), os.fspath(path) + ".pub"
    for target in (private, public):
        if os.path.exists(target):
            raise SigningError(f"{target} exists; not overwriting a key")
    try:
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(str(signer) + "\n")
        with open(public, "x", encoding="utf-8") as handle:
            handle.write(str(signer.verifier()) + "\n")
    except OSError as e:
        raise SigningError(f"cannot write the key: {e}") from None
    return private, public


@dataclass(frozen=True)
class CommandSigner:
    """A signer that runs ``command`` with the note text on stdin.

    The command prints the signature: the base64 of (key id || signature), or the whole
    ``— name base64`` line.  ``verifier`` is the key that signature must verify under
    (it is checked before the note is written anywhere).
    """

    command: str
    verifier_key: Verifier
    timeout: float = 60.0

    @property
    def name(self) -> str:
        return self.verifier_key.name

    @property
    def id(self) -> int:
        return self.verifier_key.id

    def sign(self, message: bytes) -> bytes:
        try:
            done = subprocess.run(
                shlex.split(self.command), input=message, capture_output=True, timeout=self.timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SigningError(f"signer command {self.command!r} could not run: {e}") from None
        if done.returncode != 0:
            detail = done.stderr.decode("utf-8", "replace").strip()[:200]
            raise SigningError(f"signer command {self.command!r} exited {done.returncode}: {detail}")
        out = done.stdout.decode("utf-8", "replace").strip().split(" ")[-1]
        try:
            raw = base64.b64decode(out, validate=True)
        except binascii.Error:
            raise SigningError(f"signer command {self.command!r} printed no base64 signature") from None
        if len(raw) != 68 or int.from_bytes(raw[:4]) != self.id:
            raise SigningError(f"signer command {self.command!r} signed with another key than {self.name!r}")
        if not self.verifier_key.verify(message, raw[4:]):
            raise SigningError(f"signer command {self.command!r} gave a signature that does not verify")
        return raw[4:]


def sign_note(text: str, signers: list[Signer], *, existing: str | None = None) -> str:
    """A signed note of ``text`` (ending in a newline) with a signature line per signer.

    ``existing``: a note of the same text whose signatures are kept (cosigning).
    """
    if not text.endswith("\n") or "\n\n" in text:
        raise SigningError("note text must end in a newline and hold no blank line")
    lines = []
    if existing is not None:
        old_text, sigs = split_note(existing)
        if old_text != text:
            raise SigningError("cannot add a signature to a note of another text")
        lines = [f"— {s.name} {base64.b64encode(s.id.to_bytes(4, 'big') + s.signature).decode()}" for s in sigs]
    for signer in signers:
        signature = signer.sign(text.encode("utf-8"))
        lines.append(f"— {signer.name} {base64.b64encode(signer.id.to_bytes(4, 'big') + signature).decode()}")
    return text + "\n" + "".join(line + "\n" for line in lines)
