"""bookstream as a PySpark data source and sink (Spark 4's Python Data
Source API), format name ``bookstream``.

    from pyspark.sql import SparkSession
    import stream.spark

    spark = SparkSession.builder.getOrCreate()
    stream.spark.register(spark)
    df = spark.read.format("bookstream").option("etcd", "127.0.0.1:2379").option("stream", "orders").load()

Rooms: ``plan.py`` (offsets, positions, partition planning: pure),
``access.py`` (the adapter to bookstream's client), ``source.py`` (batch and
streaming readers), ``sink.py`` (batch and streaming writers), ``commit.py``
(the sink's etcd transactions), ``recovery_plan.py`` (the re-replication
job's decisions: pure) and ``recover.py`` (``bookstream recover --spark``:
one task per fragment), ``bench.py``.
"""
from __future__ import annotations

from pyspark.sql.datasource import DataSource

from stream.spark.source import SCHEMA, BatchReader, StreamReader


class BookstreamDataSource(DataSource):
    """The ``bookstream`` format: read a stream, a log or a ledger; write a
    log or a stream."""

    @classmethod
    def name(cls) -> str:
        return "bookstream"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema):
        return BatchReader(self.options)

    def streamReader(self, schema):
        return StreamReader(self.options)

    def writer(self, schema, overwrite: bool):
        from stream.spark.sink import BatchWriter

        return BatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from stream.spark.sink import StreamingWriter

        return StreamingWriter(self.options, schema, overwrite)


def register(spark) -> None:
    """Registers the ``bookstream`` format with a SparkSession."""
    spark.dataSource.register(BookstreamDataSource)


__all__ = ["BookstreamDataSource", "register", "SCHEMA"]
