"""TxnOffsetCommit (key 28), versions 0-3: a transactional producer commits a consumer group's
offsets inside its transaction (``send_offsets_to_transaction``).

As Kafka's ``handleTxnOffsetCommitRequest``: a topic that does not exist, or a partition beyond
its count, answers UNKNOWN_TOPIC_OR_PARTITION. KIP-890 part 1: the group's
``__consumer_offsets`` partition must be in the producer's ongoing transaction
(AddOffsetsToTxn), else every partition answers the verification's error (INVALID_TXN_STATE,
INVALID_PRODUCER_EPOCH, ...). The group coordinator then checks v3's generation, member and
instance id (KIP-447: ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID), appends
the offsets in a transactional batch of the producer and holds them pending: invisible to
OffsetFetch (UNSTABLE_OFFSET_COMMIT under require_stable) until the transaction's marker
commits them, or drops them on abort. Event loop thread.
"""

from __future__ import annotations

from headrace.broker.handlers.offset_commit import _partition_error
from headrace.coordinator.messages import OffsetAndMetadata, TxnOffsetCommitRequest
from headrace.coordinator.records import OFFSETS_TOPIC_NAME
from headrace.coordinator.transaction import produce_verification_error_code
from headrace.errors import CoordinatorNotAvailable, NotEnoughReplicas

API_KEY = 28
MIN_VERSION = 0
MAX_VERSION = 3


def _verification_error(ctx, request) -> int:
    """0 when the group's offsets partition is in the producer's ongoing transaction."""
    if not ctx.broker.config.get_bool("transaction.partition.verification.enable"):
        return 0
    tp = (OFFSETS_TOPIC_NAME, ctx.broker.groups.coordinator.partition_for(request.group_id))
    code = ctx.broker.transactions.coordinator.verify(
        request.transactional_id, request.producer_id, request.producer_epoch, [tp])[tp]
    if not code:
        return 0
    code = produce_verification_error_code(code, ctx.api_version)
    return CoordinatorNotAvailable.code if code == NotEnoughReplicas.code else code


async def handle(ctx, request):
    partition_counts = {name: info.partitions
                        for name, info in ctx.broker.log_manager.topics().items()}
    offsets = {
        (topic.name, p.partition_index): OffsetAndMetadata(
            p.committed_offset, getattr(p, "committed_leader_epoch", -1),
            p.committed_metadata or "")
        for topic in request.topics for p in topic.partitions
        if not _partition_error(partition_counts, topic.name, p.partition_index)}
    errors: dict = {}
    if offsets:
        verification_error = _verification_error(ctx, request)
        if verification_error:
            errors = dict.fromkeys(offsets, verification_error)
        else:
            errors = (await ctx.broker.groups.call(TxnOffsetCommitRequest(
                request.group_id, request.producer_id, request.producer_epoch, offsets,
                getattr(request, "generation_id", -1), getattr(request, "member_id", ""),
                getattr(request, "group_instance_id", None)))).partition_errors
    return ctx.respond({"throttle_time": 0, "topics": [
        {"name": topic.name, "partitions": [
            {"partition_index": p.partition_index,
             "error_code": _partition_error(partition_counts, topic.name, p.partition_index)
             or errors.get((topic.name, p.partition_index), 0)}
            for p in topic.partitions]}
        for topic in request.topics]})
