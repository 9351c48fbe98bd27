"""A Spark standalone cluster for tests: one master and its workers, as Spark ships them.

Owns ``StandaloneCluster``: a master and ``worker_count`` workers started with the
``bin/spark-class`` of the installed pyspark package (SPARK_HOME = that package's directory; no
service installed), every daemon on 127.0.0.1 with free ports, a small daemon heap and each
worker offering ``--cores 1 --memory 1g``, its work directory and logs under ``directory``.
``start`` returns once the master's JSON page (``http://127.0.0.1:<ui port>/json``) lists every
worker ALIVE, within a bounded time; ``stop`` ends each daemon it started, by pid, and its
executors with it (each daemon leads its own process group). ``kill_worker_of`` SIGKILLs the
worker JVM whose process tree holds a given pid (an executor's Python worker, say);
``replace_worker`` starts another in its place.

The daemons run with the environment given (a shell's, without this checkout on PYTHONPATH):
executors inherit it, so which Python they run and what it imports is the driver's choice
(``spark.pyspark.python`` / PYSPARK_PYTHON), as on a real cluster. Not thread-safe: one test
thread drives it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark

from tests.conftest import free_port

SPARK_HOME = Path(pyspark.__file__).parent
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DAEMON_MEMORY = "256m"
WORKER_MEMORY = "1g"
WORKER_CORES = 1
# What a job on this cluster asks for: an executor must fit in a worker's memory.
EXECUTOR_MEMORY = "512m"
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
POLL_INTERVAL_S = 0.2
MASTER_JSON_TIMEOUT_S = 5


class StandaloneCluster:
    def __init__(self, directory: Path, environment: dict[str, str],
                 worker_count: int = 2) -> None:
        self.directory = directory
        self.environment = {**environment, "SPARK_HOME": str(SPARK_HOME),
                            "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
                            "SPARK_LOG_DIR": str(directory / "logs")}
        self.worker_count = worker_count
        self.master_port, self.ui_port = free_port(), free_port()
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.killed_workers: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.master = self._daemon("master", [MASTER_CLASS, "--host", "127.0.0.1", "--port",
                                              str(self.master_port), "--webui-port",
                                              str(self.ui_port)])
        for index in range(self.worker_count):
            self.workers.append(self._start_worker(index))
        self.wait_alive_workers(self.worker_count)

    def _start_worker(self, index: int) -> subprocess.Popen:
        work_dir = self.directory / f"worker-{index}"
        work_dir.mkdir(exist_ok=True)
        return self._daemon(f"worker-{index}", [
            WORKER_CLASS, "--host", "127.0.0.1", "--port", str(free_port()),
            "--webui-port", str(free_port()), "--cores", str(WORKER_CORES),
            "--memory", WORKER_MEMORY, "--work-dir", str(work_dir), self.master_url])

    def _daemon(self, name: str, arguments: list[str]) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115 - the child's stdout
        with log:
            return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *arguments],
                                    env=self.environment, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def master_state(self) -> dict:
        """The master's JSON page: workers, active and completed applications."""
        url = f"http://127.0.0.1:{self.ui_port}/json"
        with urllib.request.urlopen(url, timeout=MASTER_JSON_TIMEOUT_S) as response:
            return json.load(response)

    def alive_workers(self) -> int:
        try:
            state = self.master_state()
        except OSError:
            return 0
        return sum(1 for worker in state.get("workers", []) if worker["state"] == "ALIVE")

    def wait_alive_workers(self, count: int, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.alive_workers() == count:
                return
            for process in [self.master, *self.workers]:
                if process is not None and process.poll() is not None:
                    raise AssertionError(f"spark daemon {process.args[1]} exited "
                                         f"({process.returncode}); logs in {self.directory}")
            time.sleep(POLL_INTERVAL_S)
        raise AssertionError(f"{count} workers not ALIVE within {timeout_s} s "
                             f"(seen {self.alive_workers()}); logs in {self.directory}")

    def worker_holding(self, pid: int) -> subprocess.Popen:
        """The worker whose process tree holds ``pid``."""
        worker_pids = {worker.pid: worker for worker in self.workers}
        current = pid
        while current > 1:
            if current in worker_pids:
                return worker_pids[current]
            current = _parent_pid(current)
        raise AssertionError(f"pid {pid} is not under any worker of this cluster")

    def kill_worker_of(self, pid: int) -> subprocess.Popen:
        """SIGKILL the worker JVM whose process tree holds ``pid`` (its executors are left to
        notice, as Spark's executors do when their worker goes away)."""
        worker = self.worker_holding(pid)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=STOP_TIMEOUT_S)
        self.workers.remove(worker)
        self.killed_workers.append(worker)
        return worker

    def wait_worker_gone(self, worker: subprocess.Popen) -> None:
        """Wait until every process of a killed worker's group has exited (bounded; what is
        left after ``STOP_TIMEOUT_S`` is SIGKILLed)."""
        _wait_group_gone(worker.pid)

    def replace_worker(self) -> None:
        """Start one more worker and wait until ``worker_count`` are ALIVE again."""
        index = len(self.workers) + len(self.killed_workers)
        self.workers.append(self._start_worker(index))
        self.wait_alive_workers(self.worker_count)

    def stop(self) -> None:
        for process in [*self.workers, *self.killed_workers, self.master]:
            if process is None:
                continue
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for process in [*self.workers, *self.killed_workers, self.master]:
            if process is None:
                continue
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=STOP_TIMEOUT_S)
            _wait_group_gone(process.pid)


def _parent_pid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return 0
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _wait_group_gone(group_id: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group_id, 0)
        except ProcessLookupError:
            return
        time.sleep(POLL_INTERVAL_S)
    os.killpg(group_id, signal.SIGKILL)
