"""TLS and authentication (issue 17): certificates made in the test, a real
etcd with TLS and auth on, a real bookie serving gRPC over mutual TLS; a
client with the credentials works end to end, one without is refused with a
typed error (AuthenticationFailed), and so is the admin CLI, in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc
import pytest

from bookstream.certs import DemoCa
from bookstream_pb import bookie_pb2 as pb
from bookstream.processes import BookieProcess
from metadata.etcd_server import ManagedEtcd
from metadata.tls import EtcdAuth, TlsConfigError, TlsFiles
from stream import errors as se
from stream.bookie_client import BookieClient
from stream.client import BookKeeperClient, ClientConfig
from tests.conftest import run

PASSWORD = "s3cret-pw"


def etcdctl(etcd: ManagedEtcd, ca: str, *args: str) -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "etcdctl")
    out = subprocess.run([exe, f"--endpoints=https://{etcd.endpoint}", f"--cacert={ca}", *args],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def secure(tmp_path):
    """A CA, etcd over TLS with auth on (user root), and the files a client needs."""
    ca = DemoCa(tmp_path / "pki")
    server = ca.issue("etcd")
    etcd = ManagedEtcd(tmp_path / "etcd", tls=TlsFiles(None, server.cert, server.key),
                       client_tls=TlsFiles(ca.ca)).start()
    etcdctl(etcd, ca.ca, "user", "add", "root", f"--new-user-password={PASSWORD}")
    etcdctl(etcd, ca.ca, "user", "grant-role", "root", "root")
    etcdctl(etcd, ca.ca, "auth", "enable")
    yield ca, etcd
    etcd.stop()


def test_tls_and_auth_end_to_end(secure, tmp_path, cluster):
    ca, etcd = secure
    bookie_tls = ca.issue("bookie")
    client_tls = ca.issue("client", hosts=(), client=True)
    b = BookieProcess(tmp_path / "b0", etcd=etcd.endpoint, cluster=cluster, extra_args=[
        "--registration-ttl", "3", "--tls-cert", bookie_tls.cert, "--tls-key", bookie_tls.key,
        "--tls-ca", ca.ca,  # mutual TLS: clients must present a certificate of this CA
        "--etcd-ca", ca.ca, "--etcd-user", "root", "--etcd-password", PASSWORD]).start()
    good = dict(tls=client_tls, etcd_tls=TlsFiles(ca.ca), etcd_auth=EtcdAuth("root", PASSWORD))
    try:
        async def go():
            async with BookKeeperClient(etcd.endpoint, cluster, ClientConfig(**good)) as bk:
                lh = await bk.create_ledger(1, 1, 1)
                for i in range(3):
                    await lh.add_entry(b"secret-%d" % i)
                assert [e.payload for e in await lh.read_entries(0, 2)] == [b"secret-%d" % i for i in range(3)]
                await lh.close()

            # etcd: no user, a wrong password: one typed, non-retriable error
            async with BookKeeperClient(etcd.endpoint, cluster, ClientConfig(etcd_tls=TlsFiles(ca.ca))) as bk:
                with pytest.raises(se.AuthenticationFailed) as no_user:
                    await bk.create_ledger(1, 1, 1)
            assert not no_user.value.retriable and "user name is empty" in str(no_user.value)
            with pytest.raises(se.AuthenticationFailed):
                BookKeeperClient(etcd.endpoint, cluster, ClientConfig(etcd_tls=TlsFiles(ca.ca),
                                                                      etcd_auth=EtcdAuth("root", "wrong")))

            # the bookie: verified by the client; without a client certificate the handshake fails
            for tls in (client_tls, TlsFiles(ca.ca)):
                c = BookieClient(b.address, tls)
                try:
                    if tls is client_tls:
                        await c.stub.Info(pb.InfoRequest(),
                                          timeout=10)
                    else:
                        with pytest.raises(grpc.aio.AioRpcError) as refused:
                            await c.stub.Info(pb.InfoRequest(),
                                              timeout=10)
                        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                finally:
                    await c.close()
        run(go())
    finally:
        b.kill()

    # the admin CLI: with the options it lists the bookie; without a user, one line and a non-zero exit
    base = [sys.executable, "-m", "bookstream.cli", "--etcd-ca", ca.ca, "--tls-ca", ca.ca,
            "--tls-cert", client_tls.cert, "--tls-key", client_tls.key]
    env = dict(os.environ, BOOKSTREAM_ETCD_PASSWORD=PASSWORD)
    ok = subprocess.run(base + ["--etcd-user", "root", "ledgers", "list", "--etcd", etcd.endpoint,
                                "--cluster", cluster, "--format", "json"], capture_output=True, text=True,
                        timeout=60, env=env)
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)) == 1
    bad = subprocess.run(base + ["ledgers", "list", "--etcd", etcd.endpoint, "--cluster", cluster,
                                 "--format", "json"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode != 0 and bad.stdout == ""
    (line,) = bad.stderr.strip().splitlines()
    err = json.loads(line)["error"]
    assert err["type"] == "AuthenticationFailed" and "etcd refused" in err["message"], line


def test_tls_files_checked_up_front(tmp_path):
    with pytest.raises(TlsConfigError):
        TlsFiles(None, "cert.pem", None)
    with pytest.raises(TlsConfigError, match="missing"):
        TlsFiles(str(tmp_path / "missing.pem")).channel_credentials()


def test_standalone_tls_is_one_command(tmp_path):
    """`bookstream standalone --tls`: etcd and the bookies over (mutual) TLS; the
    printed exports are all the admin CLI needs; without them it is refused."""
    import re

    from bookstream.security import Security
    from tests.test_standalone_cli import _ctrl_c, _start, _stop

    proc, out = _start(tmp_path, "--tls")
    try:
        out.until("Ctrl-C to stop.")
        env = dict(re.findall(r"export (BOOKSTREAM_\w+)=(\S+)", out.text))
        assert set(env) == {"BOOKSTREAM_TLS_CA", "BOOKSTREAM_TLS_CERT", "BOOKSTREAM_TLS_KEY", "BOOKSTREAM_ETCD_CA"}
        etcd = re.search(r"etcd:    (\S+)", out.text)[1]
        cli = [sys.executable, "-m", "bookstream.cli", "bookies", "list", "--etcd", etcd, "--format", "json",
               "--timeout", "10"]
        ok = subprocess.run(cli, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert ok.returncode == 0, ok.stderr
        assert len(json.loads(ok.stdout)) == 2
        bid = json.loads(ok.stdout)[0]["bookie_id"]
        info = subprocess.run(cli[:4] + ["info", bid] + cli[5:], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **env})
        assert info.returncode == 0 and json.loads(info.stdout)["bookie_id"] == bid, info.stderr
        plain = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                               env={k: v for k, v in os.environ.items() if not k.startswith("BOOKSTREAM_")})
        assert plain.returncode != 0 and len(plain.stderr.strip().splitlines()) == 1

        sec = Security.of({k.removeprefix("BOOKSTREAM_").lower(): v for k, v in env.items()})

        async def go():
            async with BookKeeperClient(etcd, "default", ClientConfig(**sec.client_config())) as bk:
                lh = await bk.create_ledger(2, 2, 2)
                assert await lh.add_entry(b"over tls") == 0
                assert (await lh.read_entries(0, 0))[0].payload == b"over tls"
        run(go())
        _ctrl_c(proc, out, tmp_path)
    finally:
        _stop(proc)


def test_etcd_token_renewed_after_an_etcd_restart(secure):
    """etcd keeps its auth tokens in memory: after a restart the client's token
    is invalid, and the store authenticates again instead of failing."""
    import time

    from metadata.errors import MetadataUnavailable
    from metadata.store import MetadataStore

    ca, etcd = secure
    with MetadataStore(etcd.endpoint, tls=TlsFiles(ca.ca), auth=EtcdAuth("root", PASSWORD)) as store:
        store.put("/t/k", b"v1")
        etcd.stop()
        etcd.start()  # same ports, same data; tokens forgotten
        deadline = time.monotonic() + 30
        while True:
            try:
                got = store.get("/t/k")
                break
            except MetadataUnavailable:  # reconnecting to the restarted etcd
                assert time.monotonic() < deadline
                time.sleep(0.1)  # between two attempts of a reconnecting client
        assert got.value == b"v1"
        store.put("/t/k", b"v2")
