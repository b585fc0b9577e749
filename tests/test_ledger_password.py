"""Ledger passwords (issue 17): a ledger created with a password is read and
recovered only with it (UnauthorizedAccess, not retriable); etcd holds a
salted digest, never the password; the admin CLI's `ledgers read --password`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from metadata.layout import KeyLayout
from stream import errors as se
from stream import password
from stream.client import BookKeeperClient
from tests.conftest import run

SECRET = b"open sesame"


def test_digest_round_trip_and_reserved_key():
    d = password.digest(SECRET)
    assert SECRET.decode() not in d and d.startswith("pbkdf2-sha256$")
    password.check(1, {password.KEY: d}, SECRET)
    password.check(1, {password.KEY: d}, SECRET.decode())  # str or bytes
    for wrong in (None, b"", b"open sesamE"):
        with pytest.raises(se.UnauthorizedAccess):
            password.check(1, {password.KEY: d}, wrong)
    password.check(1, {}, None)  # no password: anyone
    with pytest.raises(se.InvalidLedgerConfig):
        password.custom_with_password({password.KEY: "x"}, None)


def test_reads_and_recovery_need_the_password(shared):
    async def go():
        async with BookKeeperClient(shared.endpoint, shared.cluster) as bk:
            lh = await bk.create_ledger(3, 3, 2, password=SECRET, custom={"app": "x"})
            for i in range(5):
                await lh.add_entry(b"e%d" % i)
            raw = bk.store.get(KeyLayout(shared.cluster).ledger_header_key(lh.ledger_id))
            assert SECRET not in raw.value and b"pbkdf2-sha256$" in raw.value
            async with BookKeeperClient(shared.endpoint, shared.cluster) as other:
                for recovery in (False, True):
                    for wrong in (None, b"guess"):
                        with pytest.raises(se.UnauthorizedAccess) as e:
                            await other.open_ledger(lh.ledger_id, recovery=recovery, password=wrong)
                        assert not e.value.retriable
                assert await lh.add_entry(b"e5") == 5  # the refused recovery fenced nothing
                rh = await other.open_ledger(lh.ledger_id, recovery=True, password=SECRET)
                assert [e.payload for e in await rh.read_entries(0, 5)] == [b"e%d" % i for i in range(6)]
                assert (await other.ledger_metadata(lh.ledger_id)).custom["app"] == "x"
            with pytest.raises(se.LedgerFenced):
                await lh.add_entry(b"late")
            return lh.ledger_id
    lid = run(go())

    cli = [sys.executable, "-m", "bookstream.cli", "ledgers", "read", str(lid), "--etcd", shared.endpoint,
           "--cluster", shared.cluster, "--format", "json", "--timeout", "20"]
    refused = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and json.loads(refused.stderr)["error"]["type"] == "UnauthorizedAccess"
    # the CLI's user passes an option, not a keyword argument
    message = json.loads(refused.stderr)["error"]["message"]
    assert "--password" in message and "password=" not in message, message
    text = subprocess.run(cli[:-4] + ["--password", "guess"], capture_output=True, text=True, timeout=60)
    assert text.returncode != 0 and text.stderr.count("\n") == 1 and "wrong password (--password)" in text.stderr, \
        text.stderr
    ok = subprocess.run(cli + ["--password", SECRET.decode()], capture_output=True, text=True, timeout=60,
                        env=dict(os.environ))
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)) == 6
