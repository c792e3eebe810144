"""The ``kayos`` Spark data source (docs/spark.md). Needs the extra ``kayos[spark]`` (pyspark,
pyarrow); importing this package does not import pyspark until a name below is used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kayos.spark.source import KayosDataSource

__all__ = ["KayosDataSource", "register"]


def register(spark: Any) -> None:
    """Registers the ``kayos`` format with a SparkSession."""
    from kayos.spark.source import KayosDataSource

    spark.dataSource.register(KayosDataSource)


def __getattr__(name: str) -> Any:
    if name == "KayosDataSource":
        from kayos.spark.source import KayosDataSource

        return KayosDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
