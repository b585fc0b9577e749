"""Ledger passwords, as BookKeeper has them: a ledger created with a password
is opened (to read, or to recover) only with it.

The password is never stored: the ledger's metadata holds a salted PBKDF2
digest under the reserved custom key ``bookstream.password``
(``pbkdf2-sha256$ITERATIONS$SALT$HASH``, base64). ``check`` compares in
constant time and raises ``UnauthorizedAccess`` (not retriable) for a
missing or wrong password. The check is made where a client opens the
ledger (``BookKeeperClient.open_ledger``); the writer created it knowing the
password. Bookies do not check it (no key travels with adds and reads).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os

from stream import errors as err

KEY = "bookstream.password"
ITERATIONS = 60_000  # about 30 ms on this machine: paid once per open


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def digest(password: bytes | str, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """The stored form of ``password``."""
    pw = _bytes(password)
    salt = salt if salt is not None else os.urandom(16)
    h = hashlib.pbkdf2_hmac("sha256", pw, salt, iterations)
    return f"pbkdf2-sha256${iterations}${_b64(salt)}${_b64(h)}"


def custom_with_password(custom: dict | None, password) -> dict:
    """The custom metadata of a new ledger: the user's, plus the digest."""
    out = dict(custom or {})
    if KEY in out:
        raise err.InvalidLedgerConfig(f"custom metadata key {KEY!r} is reserved (pass password=)")
    if password is not None:
        if not _bytes(password):
            raise err.InvalidLedgerConfig("a ledger password must not be empty")
        out[KEY] = digest(password)
    return out


def check(ledger_id: int, custom: dict, password) -> None:
    """UnauthorizedAccess unless the ledger has no password or ``password`` is it."""
    stored = custom.get(KEY)
    if stored is None:
        return
    if password is None:
        raise err.UnauthorizedAccess(f"ledger {ledger_id} was created with a password: pass password=")
    try:
        scheme, iterations, salt, h = stored.split("$")
        assert scheme == "pbkdf2-sha256"
        got = hashlib.pbkdf2_hmac("sha256", _bytes(password), base64.b64decode(salt), int(iterations))
        ok = hmac.compare_digest(got, base64.b64decode(h))
    except (ValueError, AssertionError):
        raise err.UnauthorizedAccess(f"ledger {ledger_id}: unreadable password digest") from None
    if not ok:
        raise err.UnauthorizedAccess(f"ledger {ledger_id}: wrong password")


def _bytes(password) -> bytes:
    if isinstance(password, str):
        return password.encode()
    if isinstance(password, (bytes, bytearray, memoryview)):
        return bytes(password)
    raise err.InvalidLedgerConfig(f"a ledger password is bytes or str, got {type(password).__name__}")
