"""Ledger passwords, as BookKeeper has them: a ledger created with a password
is opened (to read, or to recover) only with it.

The password is never stored: the ledger's metadata holds a salted PBKDF2
digest under the reserved custom key ``bookstream.password``
(``pbkdf2-sha256$ITERATIONS$SALT$HASH``, base64). ``check`` compares in
constant time and raises ``UnauthorizedAccess`` (not retriable) for a
missing or wrong password. The check is made where a client opens the
ledger (``BookKeeperClient.open_ledger``); the writer created it knowing the
password.

The bookies check too, with BookKeeper's *master key*: the key a client
derives from the password, here the PBKDF2 hash itself (``HASH`` above:
``check`` computes it from the password; BookKeeper's is SHA-1("ledger" +
password)).  It travels with every request that writes or changes a
ledger's state on a bookie: adds (one per frame), fencing and
term-carrying reads, explicit LACs, prepares, deletes; the password never
does.  A bookie learns the key's verifier (a SHA-256 of it,
``bookie.core.verifier_of``: its disk never holds the key) from the first
such request for the ledger, journals it, and refuses a request with
another key with UNAUTHORIZED_ACCESS (``stream.errors.UnauthorizedAccess``).
Normal reads are not checked by the bookies (as in BookKeeper): they change
nothing, honest clients are stopped by ``check`` at open, and who may talk
to a bookie at all is mutual TLS's to decide (bookie/server.py ``--tls-ca``).

Who writes a password ledger's entries without the password: recovery,
ensemble changes and the writer itself hold it, but autorecovery's copier
and the Spark recover job do not.  They take the master key from the
metadata (``master_key``): the digest in etcd serves as the copy
credential, as BookKeeper's autorecovery uses the password its ledger
metadata holds in clear.  What that gives away: anyone who can read the
ledger's metadata in etcd can write to the ledger's bookies.  Such access
is privileged already (it can rewrite the ensembles, the state, delete the
ledger; turn on etcd auth and TLS, README "Security"), and what it reveals
is a salted, slow hash, not the password (which users reuse elsewhere).
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


def master_key(custom: dict) -> bytes:
    """The ledger's master key as its metadata holds it (b"": no password):
    what autorecovery and the other privileged copiers send the bookies."""
    stored = custom.get(KEY)
    if stored is None:
        return b""
    try:
        return base64.b64decode(stored.rsplit("$", 1)[1], validate=True)
    except (ValueError, IndexError):
        raise err.UnauthorizedAccess(f"unreadable password digest {stored!r}") from None


def check(ledger_id: int, custom: dict, password) -> bytes:
    """UnauthorizedAccess unless the ledger has no password or ``password``
    is it.  Returns the master key derived from ``password`` (b"": none)."""
    stored = custom.get(KEY)
    if stored is None:
        return b""
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
    return got


def _bytes(password) -> bytes:
    if isinstance(password, str):
        return password.encode()
    if isinstance(password, (bytes, bytearray, memoryview)):
        return bytes(password)
    raise err.InvalidLedgerConfig(f"a ledger password is bytes or str, got {type(password).__name__}")
