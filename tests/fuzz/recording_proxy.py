"""A loopback TCP proxy that records the request frames real clients send to a broker, and
the capture of such frames from confluent-kafka, kafka-python and aiokafka.

``RecordingProxy(listen_port, broker_port)`` accepts on 127.0.0.1:``listen_port`` and
forwards each connection to the broker both ways, byte for byte; every complete frame
(int32 length + body) a client sends is appended to ``frames``. The broker must advertise the
proxy's port (``advertised.listeners``) so that clients come back through it after the
bootstrap Metadata. Two threads per connection; ``frames`` is appended under a lock.

``capture_client_requests(bootstrap)`` runs each client through a produce and a group
consume of a few records; the frames are the wire fuzzer's second kind of seed
(``tests/fuzz/client_requests.txt``, one hex frame per line, written by
``bench/fuzz_wire.py --record-client-requests``).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer

CLIENT_REQUESTS_PATH = Path(__file__).with_name("client_requests.txt")
FRAME_LENGTH_BYTES = 4
RECV_BYTES = 65536
CLIENT_TIMEOUT_S = 30.0
CLIENT_RECORDS = 3
CONSUME_POLL_S = 0.2


class RecordingProxy:
    def __init__(self, listen_port: int, broker_port: int) -> None:
        self.broker_port = broker_port
        self.frames: list[bytes] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", listen_port))
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._start(self._accept_loop)

    def _start(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            broker = socket.create_connection(("127.0.0.1", self.broker_port))
            self._start(self._pump, client, broker, True)
            self._start(self._pump, broker, client, False)

    def _pump(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        pending = bytearray()
        try:
            while chunk := source.recv(RECV_BYTES):
                sink.sendall(chunk)
                if record:
                    pending += chunk
                    self._take_frames(pending)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _take_frames(self, pending: bytearray) -> None:
        while len(pending) >= FRAME_LENGTH_BYTES:
            (size,) = struct.unpack_from(">i", pending)
            end = FRAME_LENGTH_BYTES + size
            if len(pending) < end:
                return
            with self._lock:
                self.frames.append(bytes(pending[:end]))
            del pending[:end]

    def close(self) -> None:
        self._closed.set()
        self._server.close()


def _confluent(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "compression.type": "lz4"})
    for i in range(CLIENT_RECORDS):
        producer.produce(topic, b"value-%d" % i, key=b"key-%d" % i, headers=[("h", b"v")])
    producer.flush(CLIENT_TIMEOUT_S)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-confluent",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    seen = 0
    for _ in range(int(CLIENT_TIMEOUT_S / CONSUME_POLL_S)):
        message = consumer.poll(CONSUME_POLL_S)
        if message is not None and not message.error():
            seen += 1
            if seen >= CLIENT_RECORDS:
                break
    consumer.commit(asynchronous=False)
    consumer.close()


def _kafka_python(bootstrap: str, topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip")
    for i in range(CLIENT_RECORDS):
        producer.send(topic, b"value-%d" % i, key=b"key-%d" % i)
    producer.flush(CLIENT_TIMEOUT_S)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"{topic}-kp",
                             auto_offset_reset="earliest",
                             consumer_timeout_ms=int(CLIENT_TIMEOUT_S * 1000))
    for seen, _ in enumerate(consumer, 1):
        if seen >= CLIENT_RECORDS:
            break
    consumer.commit()
    consumer.close()


async def _aiokafka(bootstrap: str, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(CLIENT_RECORDS):
            await producer.send_and_wait(topic, b"value-%d" % i, key=b"key-%d" % i)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"{topic}-aio",
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        await asyncio.wait_for(consumer.getmany(timeout_ms=int(CLIENT_TIMEOUT_S * 1000)),
                               CLIENT_TIMEOUT_S)
        await consumer.commit()
    finally:
        await consumer.stop()


def capture_client_requests(bootstrap: str) -> None:
    """Drive each client through ``bootstrap`` (the proxy): produce, consume in a group,
    commit."""
    topic = f"recorded-{uuid.uuid4().hex[:8]}"
    _confluent(bootstrap, topic)
    _kafka_python(bootstrap, topic)
    asyncio.run(_aiokafka(bootstrap, topic))


def load_client_requests(path: Path = CLIENT_REQUESTS_PATH) -> tuple[bytes, ...]:
    if not path.exists():
        return ()
    return tuple(bytes.fromhex(line) for line in path.read_text().split())
