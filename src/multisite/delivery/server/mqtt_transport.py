"""The broker transport of delivery: messages through an MQTT broker (Mosquitto), QoS 1, persistent
sessions (paho-mqtt). See ``delivery/DESIGN.md`` and ``docs/decisions.md`` for the choice.

An address ``mqtt://HOST:PORT/TOPIC`` names a recipient's queue: the topic its agent subscribes to.

- ``MqttOutbox`` publishes each message to the recipient's topic with QoS 1 and returns only once
  the broker acknowledged it (PUBACK): from then the broker holds it for the recipient's persistent
  session, for as long as the recipient is away. No PUBACK in time raises, and the sender's
  ``log_sent`` does not move (the message is sent again next poll; a copy that did arrive is dropped
  as a duplicate).
- ``MqttFeeder`` is the receiving side: a persistent session (a fixed client id, clean_session off)
  subscribed with QoS 1 to the agent's own topic. Each message is written into the agent's inbox
  folder (atomically, fsynced) and only then acknowledged (manual acks): a crash between the two
  makes the broker deliver it again, never lose it. The agent then reads its inbox as for the file
  transport.

The payload is ``u16 name length | file name | message bytes`` (the message is already compressed,
and encrypted where the link has a key: a broker is not a private transport).
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from ...errors import DeliveryConfigError, DeliveryError
from ...fsutil import atomic_write, make_dir
from .transport import register_scheme

log = logging.getLogger("multisite.delivery")

PUBACK_TIMEOUT_S = 30.0  # how long a publish waits for the broker's acknowledgement
CONNECT_TIMEOUT_S = 10.0
FEED_IDLE_S = 0.3  # a feed ends once no message arrived for this long
FEED_MAX_S = 10.0  # and at the latest after this long (the agent's poll goes on)
_NAME = struct.Struct("<H")


def parse_address(address: str) -> tuple[str, int, str]:
    u = urlsplit(address)
    topic = u.path.lstrip("/")
    if u.scheme != "mqtt" or not u.hostname or not topic or "#" in topic or "+" in topic:
        raise DeliveryConfigError(f"address {address!r}: an MQTT address is mqtt://HOST:PORT/TOPIC (no wildcards)")
    try:
        port = u.port or 1883
    except ValueError as e:
        raise DeliveryConfigError(f"address {address!r}: {e}") from None
    return u.hostname, port, topic


def _client(client_id: str, *, persistent: bool):
    try:
        import paho.mqtt.client as mqtt
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise DeliveryConfigError("the mqtt:// transport needs paho-mqtt (pip install paho-mqtt)") from e
    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=not persistent,
                       protocol=mqtt.MQTTv311, manual_ack=persistent)


def _connect(client, host: str, port: int, what: str) -> None:
    connected = threading.Event()
    client.on_connect = lambda c, u, flags, rc, props=None: rc == 0 and connected.set()
    try:
        client.connect(host, port, keepalive=60)
    except OSError as e:
        raise DeliveryError(f"cannot reach the MQTT broker at {host}:{port} for {what}: {e}") from e
    client.loop_start()
    if not connected.wait(CONNECT_TIMEOUT_S):
        client.loop_stop()
        raise DeliveryError(f"the MQTT broker at {host}:{port} did not accept {what} within {CONNECT_TIMEOUT_S} s")


class MqttOutbox:
    """Publishes messages to one recipient's topic, QoS 1, waiting for the broker's PUBACK."""

    def __init__(self, address: str, spool: Path | None = None):
        self.host, self.port, self.topic = parse_address(address)
        self.client = _client(f"multisite-out-{id(self):x}-{time.time_ns()}", persistent=False)
        _connect(self.client, self.host, self.port, f"sending to {self.topic}")

    def send(self, name: str, data: bytes) -> None:
        nb = name.encode()
        info = self.client.publish(self.topic, _NAME.pack(len(nb)) + nb + data, qos=1)
        try:
            info.wait_for_publish(PUBACK_TIMEOUT_S)
        except (RuntimeError, ValueError) as e:
            raise DeliveryError(f"publishing {name} to {self.topic} on {self.host}:{self.port} failed: {e}") from e
        if not info.is_published():
            raise DeliveryError(f"the MQTT broker at {self.host}:{self.port} did not acknowledge {name} within "
                                f"{PUBACK_TIMEOUT_S} s; it is sent again on the next poll")

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class MqttFeeder:
    """Moves the messages waiting for this agent at the broker into its inbox folder."""

    def __init__(self, address: str, inbox: Path, client_id: str):
        self.host, self.port, self.topic = parse_address(address)
        self.inbox = Path(inbox)
        make_dir(self.inbox)
        self.last_arrival = 0.0
        self.count = 0
        self.client = _client(client_id, persistent=True)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a, **k: None
        _connect(self.client, self.host, self.port, f"the inbox {self.topic}")
        self.client.subscribe(self.topic, qos=1)

    def _on_message(self, client, userdata, msg) -> None:
        payload = msg.payload
        try:
            (n,) = _NAME.unpack_from(payload, 0)
            name = payload[2:2 + n].decode()
            if "/" in name or name.startswith("."):
                raise ValueError(f"bad file name {name!r}")
        except (struct.error, UnicodeDecodeError, ValueError) as e:
            log.error("dropped an unreadable MQTT message on %s: %s", self.topic, e)
            client.ack(msg.mid, msg.qos)
            return
        atomic_write(self.inbox / name, payload[2 + n:])  # on disk before the broker forgets it
        client.ack(msg.mid, msg.qos)
        self.count += 1
        self.last_arrival = time.monotonic()

    def feed(self) -> int:
        """Wait while messages keep arriving (up to ``FEED_MAX_S``); how many arrived meanwhile."""
        before = self.count
        start = time.monotonic()
        self.last_arrival = max(self.last_arrival, start)
        while time.monotonic() - self.last_arrival < FEED_IDLE_S and time.monotonic() - start < FEED_MAX_S:
            time.sleep(0.02)
        return self.count - before

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def register() -> None:
    """Make ``mqtt://`` addresses go through the broker."""
    register_scheme("mqtt", MqttOutbox)
