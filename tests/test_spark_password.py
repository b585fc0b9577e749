"""The Spark stream sink into a stream created with a password (issue 17):
option "password"; without it the commit is refused (UnauthorizedAccess)
and the stream is unchanged. Real local Spark session, real bookies."""
from __future__ import annotations

import uuid

import pytest

pytest.importorskip("pyspark")

from stream.stream import StreamConfig  # noqa: E402
from tests.test_spark import _append, _opts, _pending, _stream_payloads, spark  # noqa: E402,F401  (spark: the session fixture)

PW = "spark-sink-pw"


def test_stream_sink_into_a_password_stream(spark, shared):
    name = "pw-into-" + uuid.uuid4().hex[:6]
    _append(shared, name, [b"first"], StreamConfig(password=PW.encode()))
    df = spark.createDataFrame([(i, b"r%03d" % i) for i in range(200)], "k int, payload binary") \
        .repartitionByRange(2, "k")

    with pytest.raises(Exception) as refused:  # Spark wraps the commit's error
        df.write.format("bookstream").options(**_opts(shared, stream=name)).mode("append").save()
    assert "UnauthorizedAccess" in str(refused.value) or "password" in str(refused.value), str(refused.value)[:2000]
    with pytest.raises(Exception):
        df.write.format("bookstream").options(**_opts(shared, stream=name, password="wrong")).mode("append").save()
    assert _stream_payloads(shared, name, PW) == [b"first"]  # refused commits appended nothing
    assert not _pending(shared)  # and their task ledgers are gone (abort)

    df.write.format("bookstream").options(**_opts(shared, stream=name, password=PW)).mode("append").save()
    assert _stream_payloads(shared, name, PW) == [b"first"] + [b"r%03d" % i for i in range(200)]
    assert not _pending(shared)

    with pytest.raises(Exception, match="password"):  # a log sink has no password to take
        df.write.format("bookstream").options(**_opts(shared, log="l-" + name, password=PW)).mode("append").save()
