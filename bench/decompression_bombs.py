"""Broker memory and CPU spent refusing decompression bombs, per codec and bomb shape.

For each codec (gzip, snappy, lz4, zstd), bomb shape (``record``: one well-formed record of
``--gib`` GiB of zeros; ``zeros``: that many zeros and no valid record; snappy: a block whose
preamble declares it -- see ``tests/decompression_bombs.py``) and topic kind (``producer``:
the producer's codec is kept; ``recompress``: the topic's compression.type differs), a fresh
broker process (127.0.0.1, scratch data under ``--scratch``) gets one warm-up batch, then
the bomb over the raw wire client while a thread samples its VmRSS. Printed per case: the
error code answered, the bomb's size on the wire, the peak RSS growth over the RSS before
the request, and the broker's CPU time (user + system, /proc/<pid>/stat) from sending the
request to its response.

    .venv/bin/python bench/decompression_bombs.py --gib 1

CPU time is counted in clock ticks (10 ms) and includes the broker's idle ticking; the RSS
figure is what the broker tests bound (``RSS_GROWTH_LIMIT_BYTES``, 64 MiB).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.errors import ERRORS_BY_CODE  # noqa: E402
from headrace.protocol.compression import CODEC_NAMES, GZIP, LZ4, SNAPPY, ZSTD  # noqa: E402
from headrace.protocol.records import build_batch  # noqa: E402
from tests.broker.raw_client import RawClient  # noqa: E402
from tests.conftest import BrokerProcess  # noqa: E402
from tests.decompression_bombs import (  # noqa: E402
    SHAPES,
    RssSampler,
    bomb_batch,
    cpu_seconds,
    produce_error_code,
    produce_frame,
)

CODECS = (GZIP, SNAPPY, LZ4, ZSTD)
RECOMPRESS_TARGET = {GZIP: "zstd", SNAPPY: "zstd", LZ4: "zstd", ZSTD: "lz4"}
TOPIC_MAX_MESSAGE_BYTES = 8 << 20
ADMIN_TIMEOUT_S = 30
MIB = 1 << 20


def _send_measured(bootstrap: str, pid: int, topic: str, batch: bytes
                   ) -> tuple[int, int, float]:
    """(error code, peak RSS growth in bytes, broker CPU seconds) of one produce."""
    with RawClient(bootstrap) as client:
        frame = produce_frame(topic, batch)
        sampler = RssSampler(pid)
        cpu_before_s = cpu_seconds(pid)
        sampler.start()
        try:
            client.send_bytes(frame)
            response = client.receive_frame()
        finally:
            cpu_after_s = cpu_seconds(pid)
            sampler.stopped.set()
            sampler.join()
    return (produce_error_code(response), sampler.peak_bytes - sampler.start_bytes,
            cpu_after_s - cpu_before_s)


def _one_case(scratch: Path, codec: int, shape: str, topic_kind: str, inflated_bytes: int
              ) -> tuple[int, int, int, float]:
    data_dir = scratch / f"{CODEC_NAMES[codec]}-{shape}-{topic_kind}"
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    broker = BrokerProcess(data_dir)
    broker.start()
    try:
        compression_type = RECOMPRESS_TARGET[codec] if topic_kind == "recompress" else "producer"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
        admin.create_topics([NewTopic(
            "bombs", 1, 1, config={"compression.type": compression_type,
                                   "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)})]
        )["bombs"].result(ADMIN_TIMEOUT_S)
        now_ms = int(time.time() * 1000)
        warm_up = build_batch([(b"k", b"warm-up", [], now_ms)], compression=codec)
        if _send_measured(broker.bootstrap, broker.pid, "bombs", warm_up)[0] != 0:
            raise RuntimeError("the warm-up batch was refused")
        batch = bomb_batch(codec, shape, inflated_bytes, now_ms)
        error_code, growth_bytes, cpu_s = _send_measured(broker.bootstrap, broker.pid, "bombs",
                                                         batch)
        return error_code, len(batch), growth_bytes, cpu_s
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="inflated size of each bomb")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/decompression-bombs-bench"))
    args = parser.parse_args()
    inflated_bytes = int(args.gib * (1 << 30)) // MIB * MIB
    print(f"bombs inflating to {inflated_bytes / (1 << 30):.2f} GiB; fresh broker per case")
    print(f"{'codec':<7} {'shape':<7} {'topic':<11} {'error':<22} {'batch KiB':>9} "
          f"{'RSS growth MiB':>15} {'broker CPU ms':>14}")
    try:
        for codec in CODECS:
            for shape in SHAPES:
                for topic_kind in ("producer", "recompress"):
                    error_code, batch_bytes, growth_bytes, cpu_s = _one_case(
                        args.scratch, codec, shape, topic_kind, inflated_bytes)
                    error_name = ERRORS_BY_CODE[error_code].__name__ if error_code else "none"
                    print(f"{CODEC_NAMES[codec]:<7} {shape:<7} {topic_kind:<11} "
                          f"{error_name + f' ({error_code})':<22} {batch_bytes / 1024:>9.0f} "
                          f"{growth_bytes / MIB:>15.1f} {cpu_s * 1000:>14.0f}", flush=True)
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
