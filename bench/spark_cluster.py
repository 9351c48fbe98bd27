"""A Spark read of a topic on a standalone cluster of two workers against ``local[2]``.

Produces ``--records`` records of 1 KiB (1,000,000 = 1 GB) into a new topic of
``--partitions`` partitions, starts a Spark standalone cluster on 127.0.0.1 (a master and
``--workers`` workers of one core each, tests/spark/standalone.py: ``spark-class`` of the
installed pyspark, no service), then reads the whole topic with
``spark.read.format("headrace")`` into ``format("noop")``, first with the cluster as master,
then with ``local[2]``, each in a fresh SparkSession after ``--warmups`` untimed reads. Both
masters get the same two task slots; the cluster adds executors in their own JVMs, task
launches over RPC, and results reported back to the driver. Prints one JSON line: per master
the median seconds, rows/s and MB/s of ``--repeat`` reads, and the cluster's rows/s as a
ratio of local[2]'s.

Executors import headrace from this checkout (``spark.executorEnv.PYTHONPATH``) and run this
interpreter (PYSPARK_PYTHON), as the tests' wheel-installed workers would, on one machine.

    bench/run-headrace.sh -- sh -c '.venv/bin/python bench/spark_cluster.py --bootstrap $BOOTSTRAP'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from confluent_kafka.admin import AdminClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_read import MB, RECORD_BYTES, _create_topic, produce_plain, read_spark  # noqa: E402

from tests.spark.standalone import EXECUTOR_MEMORY, StandaloneCluster  # noqa: E402

REPOSITORY_ROOT = Path(__file__).resolve().parents[1]
LOCAL_MASTER = "local[2]"


def session(master: str, executor_cores: int):
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("headrace-spark-cluster-bench")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.executor.memory", EXECUTOR_MEMORY)
               .config("spark.executor.cores", str(executor_cores))
               .config("spark.executorEnv.PYTHONPATH", str(REPOSITORY_ROOT)))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed_reads(master: str, bootstrap: str, topic: str, ends: dict[int, int],
                warmups: int, repeat: int) -> list[float]:
    spark = session(master, executor_cores=1)
    try:
        for _ in range(warmups):
            read_spark(spark, bootstrap, topic, ends)
        return [read_spark(spark, bootstrap, topic, ends) for _ in range(repeat)]
    finally:
        spark.stop()


def summary(seconds: list[float], records: int) -> dict:
    median_s = statistics.median(seconds)
    return {"median_s": round(median_s, 3), "rows_per_s": round(records / median_s),
            "mb_per_s": round(records * RECORD_BYTES / MB / median_s, 1),
            "runs_s": [round(value, 3) for value in seconds]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmups", type=int, default=2)
    args = parser.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    topic = _create_topic(AdminClient({"bootstrap.servers": args.bootstrap}), args.partitions)
    produce_plain(args.bootstrap, topic, args.records, args.partitions)
    ends = {p: len(range(p, args.records, args.partitions)) for p in range(args.partitions)}

    results = {"records": args.records, "partitions": args.partitions,
               "workers": args.workers}
    with tempfile.TemporaryDirectory(prefix="spark-cluster-bench-") as directory:
        cluster = StandaloneCluster(Path(directory), dict(os.environ), args.workers)
        try:
            cluster.start()
            results["cluster"] = summary(timed_reads(cluster.master_url, args.bootstrap, topic,
                                                     ends, args.warmups, args.repeat),
                                         args.records)
        finally:
            cluster.stop()
    results[LOCAL_MASTER] = summary(timed_reads(LOCAL_MASTER, args.bootstrap, topic, ends,
                                                args.warmups, args.repeat), args.records)
    results["cluster_vs_local"] = round(results[LOCAL_MASTER]["median_s"]
                                        / results["cluster"]["median_s"], 3)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
