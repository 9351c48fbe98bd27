"""spark.read.format("headrace") and the examples as a user runs them: installed, run elsewhere.

Each case installs the checkout under test into a fresh virtual environment as a user does
(``pip install -e``, as ``make install`` runs it, or a wheel built by ``pip wheel``) and drives
Spark from a subprocess started with that environment's python, a temporary directory as its
working directory and a PATH without any virtual environment (nothing activated). PySpark then
finds the data source only through what the installation put on sys.path, not through the
repository being the working directory, and its Python workers run on whatever interpreter the
driver's session chose.

The environments take their dependencies (pyspark, pyarrow, confluent-kafka, setuptools) from
this interpreter's site-packages through a .pth path entry instead of downloading them again.
The checkout's packaging files and packages are copied first, so that building them never
rewrites the compiled extensions a running broker has loaded.
"""

from __future__ import annotations

import json
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from conftest import append, new_topic
from environments import (
    build_wheel,
    copy_checkout,
    new_environment,
    pip_install,
    user_environment,
    without_java_frames,
)

pytestmark = pytest.mark.spark

SPARK_RUN_TIMEOUT_S = 240
READ_BACK_TIMEOUT_S = 30

USER_READ_SCRIPT = """
import json, os, sys
from pyspark.sql import SparkSession

bootstrap, topic = sys.argv[1], sys.argv[2]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's own rule without an activated venv
spark = (SparkSession.builder.master("local[1]").appName("headrace-install-test")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.enabled", "false").getOrCreate())
rows = (spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic).load().select("value").collect())
print(json.dumps(sorted(row.value.decode() for row in rows)))
spark.stop()
"""


def _run_spark(python: Path, arguments: list[str], cwd: Path) -> str:
    result = subprocess.run([str(python), *arguments], cwd=cwd, env=user_environment(),
                            capture_output=True, text=True, timeout=SPARK_RUN_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + without_java_frames(result.stderr)
    return result.stdout


def _read_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values: list[bytes] = []
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        while len(values) < count and time.monotonic() < deadline:
            for message in consumer.consume(count - len(values), timeout=1.0):
                assert message.error() is None, message.error()
                values.append(message.value())
        return values
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return copy_checkout(tmp_path_factory.mktemp("install") / "checkout")


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A working directory outside the repository and the copied checkout."""
    directory = tmp_path / "elsewhere"
    directory.mkdir()
    return directory


def test_example_runs_as_its_docstring_says_from_an_editable_install(
        checkout, elsewhere, bootstrap, tmp_path):
    python = new_environment(tmp_path / "editable-venv")
    pip_install(python, "-e", str(checkout))
    source, target = new_topic(bootstrap, 1), new_topic(bootstrap, 1)
    values = [f"copied-{index}".encode() for index in range(5)]
    append(bootstrap, source, 0, values)

    _run_spark(python, [str(checkout / "examples" / "spark" / "copy_topic.py"),
                        "--bootstrap", bootstrap, "--source", source, "--target", target,
                        "--checkpoint", str(tmp_path / "checkpoint")], elsewhere)

    assert _read_values(bootstrap, target, len(values)) == values


def test_wheel_holds_the_data_source_module_and_the_extensions_and_its_short_name_reads(
        checkout, elsewhere, bootstrap, tmp_path):
    wheel = build_wheel(checkout, tmp_path / "wheels")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pyspark_headrace/__init__.py" in names
    for extension in ("protocol/_kernel", "protocol/_prepass", "protocol/_message_format",
                      "storage/_segment_io", "spark/_encoder", "broker/_scheduling"):
        assert any(name.startswith(f"headrace/{extension}.") and name.endswith(".so")
                   for name in names), extension

    python = new_environment(tmp_path / "wheel-venv")
    pip_install(python, str(wheel))
    topic = new_topic(bootstrap, 1)
    values = [f"from-wheel-{index}" for index in range(3)]
    append(bootstrap, topic, 0, [value.encode() for value in values])
    script = elsewhere / "read_topic.py"
    script.write_text(USER_READ_SCRIPT)

    output = _run_spark(python, [str(script), bootstrap, topic], elsewhere)

    assert json.loads(output.strip().splitlines()[-1]) == values
