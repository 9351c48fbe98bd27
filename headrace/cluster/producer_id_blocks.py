"""Producer ids in a cluster: blocks claimed from ZooKeeper, as Kafka's ZkProducerIdManager.

Every broker hands out producer ids (InitProducerId, the transaction coordinator) from a block
it claimed in ``/latest_producer_id_block``; blocks never overlap, so two brokers never give
two producers the same id. With per-broker ids, a producer that got its id from one broker
and writes a replicated partition whose log holds another producer's batches of the same id
would be answered DUPLICATE_SEQUENCE-style success for batches never appended.

Znode format (Kafka's ``ProducerIdBlockZNode``): JSON ``{"version":1,"broker":<claimant>,
"block_start":"<first id>","block_end":"<last id>"}`` (ids as strings, the end inclusive);
empty before the first claim. A claim reads the znode with its version, writes the block
after the one recorded (``block_end`` + 1 .. + ``block_size_ids``; 0 .. first when empty)
conditionally on that version, and on BadVersion reads again: concurrent claimants never get
the same block. A claim whose answer was lost and which is retried finds the version moved
and claims the next block: a block may be skipped, never shared.

Thread-safety: the functions hold no state; the broker's ``ProducerIdAllocator`` calls the
claimer under its lock, off the event loop (a claim is ZooKeeper I/O).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError

from headrace.cluster import zookeeper_paths as paths

PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
BLOCK_VERSION = 1
MAX_CLAIM_ATTEMPTS = 100


def encode_block(broker_id: int, first_id: int, last_id: int) -> bytes:
    return json.dumps({"version": BLOCK_VERSION, "broker": broker_id,
                       "block_start": str(first_id), "block_end": str(last_id)},
                      separators=(",", ":")).encode()


def decode_block_end(data: bytes) -> int | None:
    """The last id of the recorded block; None when no block was claimed yet."""
    if not data:
        return None
    return int(json.loads(data)["block_end"])


def claim_block(zk: KazooClient, broker_id: int, block_size_ids: int) -> tuple[int, int]:
    """Claim the block after the recorded one: (first id, last id)."""
    for _ in range(MAX_CLAIM_ATTEMPTS):
        zk.retry(zk.ensure_path, paths.LATEST_PRODUCER_ID_BLOCK)
        data, stat = zk.retry(zk.get, paths.LATEST_PRODUCER_ID_BLOCK)
        previous_end = decode_block_end(data)
        first_id = 0 if previous_end is None else previous_end + 1
        last_id = first_id + block_size_ids - 1
        try:
            zk.retry(zk.set, paths.LATEST_PRODUCER_ID_BLOCK,
                     encode_block(broker_id, first_id, last_id), version=stat.version)
        except BadVersionError:
            continue
        return first_id, last_id
    raise RuntimeError(f"no producer id block claimed in {MAX_CLAIM_ATTEMPTS} attempts")


def block_claimer(zk: KazooClient, broker_id: int,
                  block_size_ids: int = PRODUCER_ID_BLOCK_SIZE) -> Callable[[], tuple[int, int]]:
    """``() -> (first id, end id exclusive)`` of a newly claimed block, for the broker's
    ``ProducerIdAllocator``."""
    def claim() -> tuple[int, int]:
        first_id, last_id = claim_block(zk, broker_id, block_size_ids)
        return first_id, last_id + 1

    return claim
