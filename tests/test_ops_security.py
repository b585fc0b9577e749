"""Issue 17's remainder on real processes: `standalone --etcd-auth` (with
`--tls`), the admin port over HTTPS (bookie and autorecovery), certificates
made in the test (bookstream/certs.py, `cryptography`)."""
from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import stat
import subprocess
import sys
import time
import urllib.request

import pytest

from bookstream.certs import DemoCa
from bookstream.processes import AutorecoveryProcess, BookieProcess


def _https(address: str, path: str, ca: str | None, cert=None, key=None) -> tuple[int, str]:
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    with urllib.request.urlopen(f"https://{address}{path}", context=ctx, timeout=10) as r:
        return r.status, r.read().decode()


def _refused_http(address: str) -> None:
    """Plain HTTP to an HTTPS-only port gets no HTTP answer."""
    with pytest.raises(OSError):  # RemoteDisconnected, ConnectionResetError, BadStatusLine are all OSErrors here
        try:
            urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read()
        except Exception as e:  # http.client.BadStatusLine is not an OSError: same verdict
            if isinstance(e, OSError):
                raise
            raise OSError(repr(e)) from e


def _cli(args: list[str], exports: list[str] = (), env: dict | None = None) -> subprocess.CompletedProcess:
    """The admin CLI through a shell, after the `export` lines standalone printed."""
    cmd = shlex.join([sys.executable, "-m", "bookstream.cli", *args])
    script = "".join(f"export {e}\n" for e in exports) + "exec " + cmd
    base = {k: v for k, v in os.environ.items() if not k.startswith("BOOKSTREAM_")}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**base, **(env or {})})


def test_standalone_etcd_auth_with_tls(tmp_path):
    """`standalone --etcd-auth --tls`: etcd's auth on with a generated root
    password (0600, reused on restart, never printed); bookies and
    autorecovery run with it; a client without it is refused in one line; the
    printed exports are enough; the bookies' admin ports speak HTTPS only and
    want a client certificate (mutual TLS)."""
    from tests.test_standalone_cli import _ctrl_c, _start, _stop

    proc, out = _start(tmp_path, "--etcd-auth", "--tls")
    try:
        out.until("Ctrl-C to stop.")
        pw_file = tmp_path / "sa" / "etcd-root-password"
        password = pw_file.read_text().strip()
        assert len(password) >= 24 and stat.S_IMODE(pw_file.stat().st_mode) == 0o600
        assert password not in out.text  # the exports read it from its file
        exports = re.findall(r"(?m)^  export (.+)$", out.text)
        names = [e.split("=", 1)[0] for e in exports]
        assert set(names) == {"BOOKSTREAM_TLS_CA", "BOOKSTREAM_TLS_CERT", "BOOKSTREAM_TLS_KEY", "BOOKSTREAM_ETCD_CA",
                              "BOOKSTREAM_ETCD_USER", "BOOKSTREAM_ETCD_PASSWORD"}, out.text
        etcd = re.search(r"etcd:    (\S+)", out.text)[1]
        common = ["--etcd", etcd, "--format", "json", "--timeout", "10"]

        ok = _cli(["bookies", "list", *common], exports)
        assert ok.returncode == 0, ok.stderr
        assert len(json.loads(ok.stdout)) == 2
        # the autorecovery process authenticated too: it holds the auditor's election
        # (elected just after it said it is ready: asked again until then, within a deadline)
        deadline = time.monotonic() + 60
        while True:
            status = _cli(["autorecovery", "status", *common[:4]], exports)
            assert status.returncode == 0, status.stderr
            if json.loads(status.stdout)["auditor"] or time.monotonic() > deadline:
                break
        assert json.loads(status.stdout)["auditor"], (status.stdout, (tmp_path / "sa" / "autorecovery" /
                                                                      "autorecovery.log").read_text())

        # TLS but no etcd user: refused, one line, no traceback
        tls_only = [e for e in exports if not e.startswith("BOOKSTREAM_ETCD_USER")
                    and not e.startswith("BOOKSTREAM_ETCD_PASSWORD")]
        refused = _cli(["bookies", "list", *common[:2]], tls_only)
        assert refused.returncode != 0 and refused.stdout == "", refused
        assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert "etcd refused" in refused.stderr and "--etcd-user" in refused.stderr, refused.stderr
        wrong = _cli(["bookies", "list", *common], tls_only + ["BOOKSTREAM_ETCD_USER=root",
                                                                 "BOOKSTREAM_ETCD_PASSWORD=wrong"])
        assert wrong.returncode != 0 and "AuthenticationFailed" in wrong.stderr, wrong.stderr

        # the admin ports: HTTPS with the CA and a client certificate; nothing without
        pki = tmp_path / "sa" / "pki"
        admins = re.findall(r"admin=(\w+)://(\S+)", out.text)
        assert len(admins) == 2 and {s for s, _ in admins} == {"https"}, out.text
        for _, address in admins:
            code, body = _https(address, "/metrics", str(pki / "ca.pem"), str(pki / "node.pem"), str(pki / "node.key"))
            assert code == 200 and "bookstream_bookie_registered" in body
            code, body = _https(address, "/ready", str(pki / "ca.pem"), str(pki / "node.pem"), str(pki / "node.key"))
            assert code == 200 and json.loads(body)["ready"] is True
            with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
                _https(address, "/metrics", str(pki / "ca.pem"))  # no client certificate
            _refused_http(address)
        _ctrl_c(proc, out, tmp_path)

        # a restart reuses the password (etcd keeps its users): the same exports work
        proc, out = _start(tmp_path, "--etcd-auth", "--tls")
        out.until("Ctrl-C to stop.")
        assert pw_file.read_text().strip() == password
        again = _cli(["bookies", "list", *common], re.findall(r"(?m)^  export (.+)$", out.text))
        assert again.returncode == 0 and len(json.loads(again.stdout)) == 2, again.stderr
        _ctrl_c(proc, out, tmp_path)
    finally:
        _stop(proc)


def test_standalone_etcd_auth_needs_its_own_etcd(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bookstream.cli", "standalone", "--data-dir", str(tmp_path / "sa"),
                        "--etcd", "127.0.0.1:1", "--etcd-auth"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "--etcd-auth" in r.stderr


def test_bookie_admin_port_over_https(tmp_path):
    """A bookie with --admin-tls and its own certificate (no client CA): a
    scrape verified with the CA works, plain HTTP and an unverified client get
    nothing; --admin-tls without a certificate is one line, exit 2."""
    ca = DemoCa(tmp_path / "pki")
    tls = ca.issue("bookie")
    b = BookieProcess(tmp_path / "b0", extra_args=["--admin-port", "0", "--admin-tls", "--tls-cert", tls.cert,
                                                   "--tls-key", tls.key]).start()
    try:
        assert b.admin_scheme == "https"
        code, body = _https(b.admin_address, "/metrics", ca.ca)
        assert code == 200 and "bookstream_bookie_add_entries_total" in body
        assert _https(b.admin_address, "/health", ca.ca) == (200, "ok\n")
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            _https(b.admin_address, "/metrics", None)  # the system roots do not know this CA
        _refused_http(b.admin_address)
        assert b.alive()  # failed handshakes are not the bookie's errors
        code, _ = _https(b.admin_address, "/info", ca.ca)
        assert code == 200
    finally:
        b.stop()
    r = subprocess.run([sys.executable, "-m", "bookstream.cli", "bookie", "--data-dir", str(tmp_path / "b1"),
                        "--port", "0", "--admin-port", "0", "--admin-tls"],
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("BOOKSTREAM_TLS")})
    assert r.returncode == 2 and "--tls-cert" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_autorecovery_metrics_over_https(etcd_server, tmp_path, cluster):
    ca = DemoCa(tmp_path / "pki")
    tls = ca.issue("autorecovery", client=True)
    ar = AutorecoveryProcess(tmp_path / "ar", etcd=etcd_server.endpoint, cluster=cluster,
                             extra_args=["--metrics-port", "0", "--metrics-tls"])
    ar.env = {"BOOKSTREAM_TLS_CERT": tls.cert, "BOOKSTREAM_TLS_KEY": tls.key}
    ar.start()
    try:
        m = re.search(r"metrics on https://([\d.:]+)/metrics", ar.log_path.read_text())
        assert m, ar.log_path.read_text()
        code, body = _https(m[1], "/metrics", ca.ca)
        assert code == 200 and "bookstream_autorecovery_tasks_total" in body
        _refused_http(m[1])
    finally:
        ar.kill()
