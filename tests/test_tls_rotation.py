"""TLS in operation (issue 17): a bookie takes rotated certificate files up
without a restart, keeps its pair when a rotation is caught half done, and a
client checks bookies' certificates against a name of its choosing
(``--tls-server-name``) when they do not carry the registered address.
Real bookie processes, certificates made in the test."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import grpc
import pytest

from bookstream.certs import DemoCa
from bookstream.processes import BookieProcess
from bookstream_pb import bookie_pb2 as pb
from metadata.tls import TlsConfigError, TlsFiles
from stream.bookie_client import BookieClient
from stream.client import BookKeeperClient, ClientConfig
from tests.conftest import run


async def _answers(address: str, tls: TlsFiles) -> bool:
    """Whether a new channel with ``tls`` gets an answer (False: the handshake failed)."""
    c = BookieClient(address, tls)
    try:
        await c.stub.Info(pb.InfoRequest(), timeout=10)
        return True
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        return False
    finally:
        await c.close()


def _install(src: TlsFiles, dst_cert: str, dst_key: str, *, key: bool = True, cert: bool = True) -> None:
    """Puts a certificate and/or its key in place as a rotation tool does:
    written aside, then renamed over the served file."""
    for want, s, d in ((key, src.key, dst_key), (cert, src.cert, dst_cert)):
        if want:
            shutil.copyfile(s, d + ".new")
            os.replace(d + ".new", d)


def test_a_bookie_takes_rotated_certificates_up_without_a_restart(tmp_path, etcd_server, cluster):
    old_ca, new_ca = DemoCa(tmp_path / "pki-old", "old CA"), DemoCa(tmp_path / "pki-new", "new CA")
    served = tmp_path / "served"
    served.mkdir()
    cert, key = str(served / "bookie.pem"), str(served / "bookie.key")
    _install(old_ca.issue("bookie"), cert, key)
    b = BookieProcess(tmp_path / "b0", etcd=etcd_server.endpoint, cluster=cluster,
                      extra_args=["--tls-cert", cert, "--tls-key", key]).start()
    old, new = TlsFiles(old_ca.ca), TlsFiles(new_ca.ca)
    try:
        async def go():
            assert await _answers(b.address, old) and not await _answers(b.address, new)
            kept = BookieClient(b.address, old)  # a connection made before the rotation
            await kept.stub.Info(pb.InfoRequest(), timeout=10)

            _install(new_ca.issue("bookie"), cert, key)
            assert await _answers(b.address, new), "the rotated certificate was not taken up"
            assert not await _answers(b.address, old)
            await kept.stub.Info(pb.InfoRequest(), timeout=10)  # open connections keep their handshake
            await kept.close()

            # half a rotation (a certificate whose key is not there yet): the pair in use stays
            back = old_ca.issue("bookie-2")
            _install(back, cert, key, key=False)
            assert await _answers(b.address, new) and not await _answers(b.address, old)
            _install(back, cert, key, cert=False)  # the key arrives: the new pair is used
            assert await _answers(b.address, old) and not await _answers(b.address, new)
        run(go())
        assert b.proc.poll() is None  # the same process throughout
    finally:
        b.kill()


def test_a_client_checks_bookies_against_a_server_name(tmp_path, etcd_server, cluster):
    ca = DemoCa(tmp_path / "pki")
    named = ca.issue("bookie", hosts=("bookie-0.internal",))  # not the address the bookie registers
    b = BookieProcess(tmp_path / "b0", etcd=etcd_server.endpoint, cluster=cluster, extra_args=[
        "--registration-ttl", "3", "--tls-cert", named.cert, "--tls-key", named.key]).start()
    by_name = TlsFiles(ca.ca, server_name="bookie-0.internal")
    try:
        async def go():
            assert not await _answers(b.address, TlsFiles(ca.ca))  # the address is not in the certificate
            assert not await _answers(b.address, TlsFiles(ca.ca, server_name="bookie-1.internal"))
            assert await _answers(b.address, by_name)
            async with BookKeeperClient(etcd_server.endpoint, cluster, ClientConfig(tls=by_name)) as bk:
                lh = await bk.create_ledger(1, 1, 1)
                assert await lh.add_entry(b"named") == 0
                assert (await lh.read_entries(0, 0))[0].payload == b"named"
                await lh.close()
        run(go())

        cli = [sys.executable, "-m", "bookstream.cli", "--tls-ca", ca.ca, "bookies", "info", b.bookie_id,
               "--etcd", etcd_server.endpoint, "--cluster", cluster, "--format", "json", "--timeout", "10"]
        ok = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, BOOKSTREAM_TLS_SERVER_NAME="bookie-0.internal"))
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["bookie_id"] == b.bookie_id
        refused = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                                 env={k: v for k, v in os.environ.items() if not k.startswith("BOOKSTREAM_")})
        assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    finally:
        b.kill()


def test_tls_configuration_errors_are_found_at_start(tmp_path):
    with pytest.raises(TlsConfigError, match="server name"):
        TlsFiles.of(None, None, None, "bookie-0.internal")
    ca = DemoCa(tmp_path / "pki")
    a, b = ca.issue("a"), ca.issue("b")
    with pytest.raises(TlsConfigError, match="do not match"):
        TlsFiles(None, a.cert, b.key).server_credentials()
    TlsFiles(None, a.cert, a.key).server_credentials()
