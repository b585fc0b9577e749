"""The Spark source and sink against a cluster with TLS and etcd
authentication on (`standalone --tls --etcd-auth`): the options ``tlsCa``
... ``etcdPassword`` (stream/spark/access.py ``security_overrides``) carry
what the standalone prints to export; without them the job is refused.
Real processes, the real local Spark session of tests/test_spark.py."""
from __future__ import annotations

import re
import shlex
import uuid

import pytest

pytest.importorskip("pyspark")

from metadata.tls import EtcdAuth, TlsFiles  # noqa: E402
from stream.spark.access import SECURITY_OPTIONS, security_overrides  # noqa: E402
from stream.stream import StreamClient, StreamConfig  # noqa: E402
from tests.test_spark import spark  # noqa: E402,F401  (the session fixture)
from tests.test_standalone_cli import _ctrl_c, _start, _stop  # noqa: E402

E2 = StreamConfig(ensemble_size=2, write_quorum=2, ack_quorum=2)


def _secured_options(text: str, password_file) -> dict:
    """The Spark options from the standalone's printed `export` lines."""
    by_env = {}
    for line in re.findall(r"(?m)^  export (.+)$", text):
        env, value = line.split("=", 1)
        by_env[env] = password_file.read_text().strip() if env == "BOOKSTREAM_ETCD_PASSWORD" \
            else shlex.split(value)[0]
    return {opt: by_env[env] for opt, env in SECURITY_OPTIONS.items() if env in by_env}


def _client_overrides(opts: dict) -> dict:
    return {"tls": TlsFiles.of(opts["tlsCa"], opts["tlsCert"], opts["tlsKey"]),
            "etcd_tls": TlsFiles.of(opts["etcdCa"]), "etcd_auth": EtcdAuth.of(opts["etcdUser"], opts["etcdPassword"])}


def test_options_resolve_to_the_clients_settings(monkeypatch):
    for env in SECURITY_OPTIONS.values():
        monkeypatch.delenv(env, raising=False)
    assert security_overrides({}) == {"tls": None, "etcd_tls": None, "etcd_auth": None}
    monkeypatch.setenv("BOOKSTREAM_ETCD_USER", "root")
    monkeypatch.setenv("BOOKSTREAM_ETCD_PASSWORD", "from-env")
    got = security_overrides({"etcdpassword": "given"})  # (Spark lower-cases option names)
    assert got["etcd_auth"] == EtcdAuth("root", "given")
    from stream.spark.plan import PlanError
    with pytest.raises(PlanError, match="server name"):
        security_overrides({"tlsServerName": "bookie.example"})


def test_source_and_sink_on_a_cluster_with_tls_and_etcd_auth(spark, tmp_path):  # noqa: F811
    proc, out = _start(tmp_path, "--etcd-auth", "--tls")
    try:
        out.until("Ctrl-C to stop.")
        etcd = re.search(r"etcd:    (\S+)", out.text)[1]
        sec = _secured_options(out.text, tmp_path / "sa" / "etcd-root-password")
        assert set(sec) == {"tlsCa", "tlsCert", "tlsKey", "etcdCa", "etcdUser", "etcdPassword"}, out.text
        name = "sec-" + uuid.uuid4().hex[:6]
        with StreamClient(etcd, "default", **_client_overrides(sec)) as sc:
            with sc.open_writer(name, E2) as w:
                for p in (b"a", b"b", b"c"):
                    w.append(p)
                w.flush()

        base = {"etcd": etcd, "stream": name}
        with pytest.raises(Exception) as refused:  # no credentials: etcd refuses the planner
            spark.read.format("bookstream").options(**base).load().collect()
        assert re.search(r"(?i)auth|tls|ssl|certificate|unavailable|refused", str(refused.value)), \
            str(refused.value)[:2000]

        df = spark.createDataFrame([(i, b"r%02d" % i) for i in range(40)], "k int, payload binary") \
            .repartitionByRange(2, "k")
        df.write.format("bookstream").options(**base, ensembleSize="2", writeQuorum="2", ackQuorum="2",
                                              **sec).mode("append").save()
        rows = spark.read.format("bookstream").options(**base, **sec).load().orderBy("position").collect()
        assert [bytes(r.payload) for r in rows] == [b"a", b"b", b"c"] + [b"r%02d" % i for i in range(40)]
        _ctrl_c(proc, out, tmp_path)
    finally:
        _stop(proc)
