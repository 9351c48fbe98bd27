"""Spark's discovery hook for headrace: ``spark.read.format("headrace")`` without registration.

PySpark imports every installed top-level module named ``pyspark_*`` that defines a
``DefaultSource`` data source and registers it under its ``name()``. This module only re-exports
``headrace.spark.source.HeadraceDataSource``; it holds no state.
"""

from headrace.spark.source import HeadraceDataSource as DefaultSource

__all__ = ["DefaultSource"]
