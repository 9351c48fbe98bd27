"""Spark's discovery hook for headrace: ``spark.read.format("headrace")`` without registration.

PySpark 4 looks up Python data sources once per JVM, in a Python worker on the driver: it
lists the top-level modules on that worker's sys.path (``pkgutil.iter_modules``), imports every
one named ``pyspark_*`` and registers its ``DefaultSource`` under ``DefaultSource.name()``.
So this package must sit in a sys.path directory, not behind an import hook: a wheel puts it in
site-packages, and an editable install (``make install``) adds the repository root through a
.pth file (pyproject.toml says why). The worker runs PYSPARK_DRIVER_PYTHON, else
PYSPARK_PYTHON, else ``python3`` from PATH, so outside an activated virtual environment set
PYSPARK_PYTHON to its python (headrace's ``build_session`` does for local masters).

This module only re-exports ``headrace.spark.source.HeadraceDataSource``; it holds no state.
"""

from headrace.spark.source import HeadraceDataSource as DefaultSource

__all__ = ["DefaultSource"]
