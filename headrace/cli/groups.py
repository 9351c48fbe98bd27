"""``headrace groups``: list, describe, reset-offsets and delete consumer groups.

The equivalent of Kafka's ``kafka-consumer-groups.sh`` through confluent-kafka's AdminClient
(ListGroups, DescribeGroups, OffsetFetch, OffsetCommit, DeleteGroups) plus ListOffsets for log
end offsets, so it works against any Kafka-compatible cluster.

* ``describe GROUP``: one row per partition the group has a commit for or a member owns:
  committed offset, log end offset, lag (log end - committed; "-" without a commit) and the
  owning member, as ``kafka-consumer-groups.sh --describe``.
* ``reset-offsets GROUP --topic T`` with exactly one of ``--to-earliest``, ``--to-latest``,
  ``--to-datetime ISO`` (first offset whose timestamp is >= it, the log end when none; a time
  without a zone is UTC), ``--to-offset N`` or ``--shift-by N`` (both clamped to the
  partition's [earliest, latest] as Kafka does; shifting needs a committed offset). Kafka's
  rule: only an inactive group (Empty or Dead) can be reset. ``--dry-run`` (the default, as in
  Kafka) prints the plan; ``--execute`` commits it.

Stateless; runs on the main thread.
"""

from __future__ import annotations

import datetime
from typing import Annotated

import typer
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from headrace.cli.common import (
    DEFAULT_CONNECTION,
    Connection,
    OutputFormat,
    OutputOption,
    UserError,
    connection_options,
    describe_kafka_error,
    emit,
    make_table,
    report,
    topic_partitions,
    user_errors,
    wait_all,
)

INACTIVE_STATES = ("EMPTY", "DEAD")
NO_OFFSET = -1

app = typer.Typer(no_args_is_help=True, help="List, describe, reset and delete consumer groups.")

GroupArgument = Annotated[str, typer.Argument(help="consumer group id")]


def _state_name(state) -> str:
    name = getattr(state, "name", str(state))
    return name.upper()


# --- list ----------------------------------------------------------------------------------


@app.command("list")
@connection_options
def list_groups(
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Every consumer group with its state."""
    with user_errors():
        admin, _ = connection.admin()
        future = admin.list_consumer_groups(request_timeout=connection.request_timeout_s)
        listed = wait_all(
            {"the group list": future}, connection.request_timeout_ms)["the group list"]
        rows = sorted(
            ({"group": g.group_id, "state": _state_name(g.state),
              "simple": bool(g.is_simple_consumer_group)} for g in listed.valid),
            key=lambda row: row["group"],
        )
        table = make_table(None, ["group", "state", "simple"],
                           [[r["group"], r["state"], r["simple"]] for r in rows])
        emit(output, {"groups": rows}, table)


# --- describe ------------------------------------------------------------------------------


def _describe_group(admin: AdminClient, group: str, request_timeout_ms: int):
    futures = admin.describe_consumer_groups([group], request_timeout=request_timeout_ms / 1000)
    return wait_all(futures, request_timeout_ms)[group]


def _committed_offsets(admin: AdminClient, group: str, request_timeout_ms: int) -> dict:
    """``(topic, partition) -> committed offset`` of every partition the group committed."""
    futures = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=request_timeout_ms / 1000)
    result = wait_all(futures, request_timeout_ms)[group]
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions
            if tp.error is None and tp.offset >= 0}


def _list_offsets(admin: AdminClient, partitions, spec, request_timeout_ms: int) -> dict:
    """``(topic, partition) -> offset`` answered by ListOffsets for ``spec``."""
    if not partitions:
        return {}
    request = {TopicPartition(topic, partition): spec for topic, partition in partitions}
    futures = admin.list_offsets(request, request_timeout=request_timeout_ms / 1000)
    return {(tp.topic, tp.partition): info.offset
            for tp, info in wait_all(futures, request_timeout_ms).items()}


def _owners(description) -> dict:
    owners = {}
    for member in description.members:
        assignment = member.assignment.topic_partitions if member.assignment else []
        for tp in assignment:
            owners[(tp.topic, tp.partition)] = member
    return owners


def _describe_rows(admin, description, committed, request_timeout_ms) -> list[dict]:
    owners = _owners(description)
    partitions = sorted(set(committed) | set(owners))
    log_end = _list_offsets(admin, partitions, OffsetSpec.latest(), request_timeout_ms)
    rows = []
    for key in partitions:
        member = owners.get(key)
        offset = committed.get(key)
        rows.append({
            "topic": key[0], "partition": key[1], "current_offset": offset,
            "log_end_offset": log_end[key],
            "lag": None if offset is None else max(log_end[key] - offset, 0),
            "member_id": member.member_id if member else None,
            "host": member.host if member else None,
            "client_id": member.client_id if member else None,
        })
    return rows


@app.command()
@connection_options
def describe(
    group: GroupArgument,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Members, assignments, committed offsets, log end offsets and lag of a group."""
    with user_errors():
        admin, _ = connection.admin()
        description = _describe_group(admin, group, connection.request_timeout_ms)
        committed = _committed_offsets(admin, group, connection.request_timeout_ms)
        state = _state_name(description.state)
        if state == "DEAD" and not committed:
            raise UserError(f"consumer group {group!r} does not exist")
        rows = _describe_rows(admin, description, committed, connection.request_timeout_ms)
        columns = ["topic", "partition", "current_offset", "log_end_offset", "lag",
                   "member_id", "host", "client_id"]
        title = f"group {group} ({state}, {len(description.members)} members)"
        table = make_table(title, columns,
                           [["-" if r[c] is None else r[c] for c in columns] for r in rows])
        data = {"group": group, "state": state,
                "assignor": description.partition_assignor or None,
                "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                             "client_id": m.client_id, "host": m.host,
                             "assignment": sorted(
                                 [tp.topic, tp.partition]
                                 for tp in (m.assignment.topic_partitions if m.assignment
                                            else []))}
                            for m in description.members],
                "partitions": rows}
        emit(output, data, table)


# --- reset-offsets -------------------------------------------------------------------------


def _parse_datetime_ms(text: str) -> int:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"bad --to-datetime {text!r}: expected ISO 8601, "
                        "e.g. 2024-05-01T12:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def _chosen_strategy(to_earliest, to_latest, to_datetime, to_offset, shift_by) -> str:
    chosen = [name for name, value in (
        ("--to-earliest", to_earliest), ("--to-latest", to_latest),
        ("--to-datetime", to_datetime), ("--to-offset", to_offset), ("--shift-by", shift_by),
    ) if value not in (None, False)]
    if len(chosen) != 1:
        raise UserError("give exactly one of --to-earliest, --to-latest, --to-datetime, "
                        "--to-offset, --shift-by")
    return chosen[0]


def _target_offsets(admin, group, partitions, strategy, values, request_timeout_ms) -> dict:
    earliest = _list_offsets(admin, partitions, OffsetSpec.earliest(), request_timeout_ms)
    latest = _list_offsets(admin, partitions, OffsetSpec.latest(), request_timeout_ms)
    if strategy == "--to-earliest":
        return earliest
    if strategy == "--to-latest":
        return latest
    if strategy == "--to-datetime":
        spec = OffsetSpec.for_timestamp(_parse_datetime_ms(values["to_datetime"]))
        found = _list_offsets(admin, partitions, spec, request_timeout_ms)
        return {key: found[key] if found[key] >= 0 else latest[key] for key in partitions}
    if strategy == "--to-offset":
        wanted = {key: values["to_offset"] for key in partitions}
    else:
        committed = _committed_offsets(admin, group, request_timeout_ms)
        missing = [key for key in partitions if key not in committed]
        if missing:
            topic, partition = missing[0]
            raise UserError(f"cannot shift the offset of {topic}-{partition}: "
                            "the group has no committed offset for it")
        wanted = {key: committed[key] + values["shift_by"] for key in partitions}
    return {key: min(max(offset, earliest[key]), latest[key]) for key, offset in wanted.items()}


def _commit(admin, group, targets, request_timeout_ms) -> None:
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, partition, offset)
                for (topic, partition), offset in sorted(targets.items())])
    futures = admin.alter_consumer_group_offsets([request],
                                                 request_timeout=request_timeout_ms / 1000)
    result = wait_all(futures, request_timeout_ms)[group]
    for tp in result.topic_partitions:
        if tp.error is not None:
            raise UserError(f"{tp.topic}-{tp.partition}: {describe_kafka_error(tp.error)}")


@app.command("reset-offsets")
@connection_options
def reset_offsets(
    group: GroupArgument,
    topic: Annotated[str, typer.Option("--topic", "-t", help="topic whose offsets to reset")],
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_datetime: Annotated[str | None, typer.Option("--to-datetime", help="ISO 8601")] = None,
    to_offset: Annotated[int | None, typer.Option("--to-offset")] = None,
    shift_by: Annotated[int | None, typer.Option("--shift-by")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan (default)")] = False,
    execute: Annotated[bool, typer.Option("--execute", help="commit the new offsets")] = False,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Move a group's committed offsets of a topic (the group must be inactive)."""
    with user_errors():
        if dry_run and execute:
            raise UserError("give only one of --dry-run and --execute")
        strategy = _chosen_strategy(to_earliest, to_latest, to_datetime, to_offset, shift_by)
        admin, metadata = connection.admin()
        partitions = [(topic, p) for p in topic_partitions(metadata, topic)]
        state = _state_name(_describe_group(admin, group, connection.request_timeout_ms).state)
        if state not in INACTIVE_STATES:
            raise UserError(f"assignments can only be reset if the group {group!r} is "
                            f"inactive, but the current state is {state}")
        values = {"to_datetime": to_datetime, "to_offset": to_offset, "shift_by": shift_by}
        targets = _target_offsets(admin, group, partitions, strategy, values,
                                  connection.request_timeout_ms)
        if execute:
            _commit(admin, group, targets, connection.request_timeout_ms)
        rows = [{"topic": t, "partition": p, "new_offset": offset}
                for (t, p), offset in sorted(targets.items())]
        title = f"group {group}: " + ("offsets reset" if execute else "planned (dry run)")
        table = make_table(title, ["topic", "partition", "new_offset"],
                           [[r["topic"], r["partition"], r["new_offset"]] for r in rows])
        emit(output, {"group": group, "executed": execute, "partitions": rows}, table)


# --- delete --------------------------------------------------------------------------------


@app.command()
@connection_options
def delete(
    group: GroupArgument,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Delete an inactive group and its committed offsets."""
    with user_errors():
        admin, _ = connection.admin()
        futures = admin.delete_consumer_groups(
            [group], request_timeout=connection.request_timeout_s)
        try:
            wait_all(futures, connection.request_timeout_ms)
        except KafkaException as error:
            raise UserError(f"cannot delete group {group!r}: "
                            f"{describe_kafka_error(error.args[0])}") from None
        report(output, f"deleted group {group}", {"deleted": group})
