"""A broker inside a network namespace, a client cut from it by iptables rules and healed.

The broker listens on 127.0.0.2 in a namespace the harness made; the client connects from
127.0.0.3 (a socket opened inside the namespace, used from the test's thread). While a cut
stands, the rule's counter shows it dropping the client's traffic and no answer reaches the
client; once healed, TCP's retransmission delivers the answer that was held up. The
namespace, its rules and the broker are removed by name and pid in every case.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from headrace.faults.namespace import Namespace, missing_tools
from headrace.faults.node import BrokerNode, free_port
from headrace.protocol import wire
from tests.broker.raw_client import RawClient

BROKER_HOST = "127.0.0.2"
CLIENT_HOST = "127.0.0.3"
API_VERSIONS = 18
COUNTER_WAIT_TIMEOUT_S = 20.0
HEALED_ANSWER_TIMEOUT_S = 30.0


def api_versions_request(correlation_id: int) -> bytes:
    body = wire.build(wire.request_class(API_VERSIONS, 0), {})
    return wire.encode_request(API_VERSIONS, 0, correlation_id, "cut-test", body)


def wait_for_drops(namespace: Namespace, cut) -> int:
    deadline = time.monotonic() + COUNTER_WAIT_TIMEOUT_S
    while (dropped := namespace.dropped_packets(cut)) == 0:
        assert time.monotonic() < deadline, f"{cut} dropped nothing in {COUNTER_WAIT_TIMEOUT_S} s"
        time.sleep(0.05)
    return dropped


def nothing_to_read(client: RawClient) -> bool:
    client.sock.setblocking(False)
    try:
        client.sock.recv(1)
    except BlockingIOError:
        return True
    finally:
        client.sock.setblocking(True)
    return False


@pytest.fixture
def namespaced_broker(tmp_path):
    if missing_tools():
        pytest.skip(f"network namespaces need {', '.join(missing_tools())}")
    namespace = Namespace()
    node = None
    try:
        namespace.create([BROKER_HOST, CLIENT_HOST])
        node = BrokerNode("broker-1", BROKER_HOST, free_port(BROKER_HOST, namespace),
                          tmp_path / "data", namespace=namespace)
        node.start()
        yield namespace, node
    finally:
        if node is not None:
            node.kill()
        namespace.remove()


@pytest.mark.required_where("netns")
@pytest.mark.parametrize("direction", ["to-broker", "from-broker", "both"])
def test_a_cut_client_gets_no_answer_until_the_cut_heals(namespaced_broker, direction):
    namespace, node = namespaced_broker
    client = namespace.run_inside(lambda: RawClient(node.bootstrap, CLIENT_HOST), 10)
    try:
        assert client.request(API_VERSIONS, 0, {}).error_code == 0
        cuts = []
        if direction in ("to-broker", "both"):
            cuts.append(namespace.cut(CLIENT_HOST, BROKER_HOST))
        if direction in ("from-broker", "both"):
            cuts.append(namespace.cut(BROKER_HOST, CLIENT_HOST))
        client.send_bytes(api_versions_request(client.correlation_id + 1))
        wait_for_drops(namespace, cuts[0])  # cut both ways, the request never reaches it
        assert nothing_to_read(client), "an answer crossed the cut"
        namespace.heal_all()
        client.sock.settimeout(HEALED_ANSWER_TIMEOUT_S)
        received_id, body = wire.decode_response(API_VERSIONS, 0, client.receive_frame())
        assert received_id == client.correlation_id + 1
        assert body.error_code == 0
    finally:
        client.close()


@pytest.mark.required_where("netns")
def test_removing_the_namespace_removes_its_rules_and_itself():
    if missing_tools():
        pytest.skip(f"network namespaces need {', '.join(missing_tools())}")
    namespace = Namespace()
    with namespace:
        namespace.create([BROKER_HOST])
        namespace.cut_both_ways(BROKER_HOST, CLIENT_HOST)
        assert len(namespace.cuts) == 2
    assert namespace.cuts == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert namespace.name not in listed.split()
