"""forkserve.http.transport.Outbox: whole responses written at the end of the
event loop's pass (the batch_responses setting), on socket pairs in this process's hub."""

import os
import socket

import gevent
import gevent.socket
import pytest

from forkserve.config import settings
from forkserve.http.h1 import ClientDisconnected
from forkserve.http.transport import Outbox, Transport
from forkserve.process.gevent_servers import outbox_for


@pytest.fixture
def pairs():
    """Socket pairs: (ours, a gevent socket as the server's; the client's, non-blocking)."""
    made = []

    def make(count):
        for _ in range(count):
            ours, theirs = socket.socketpair()
            ours = gevent.socket.socket(fileno=ours.detach())
            theirs.setblocking(False)
            made.append((ours, theirs))
        return made[-count:]

    yield make
    for ours, theirs in made:
        ours.close()
        theirs.close()


def _received(sock):
    try:
        return sock.recv(1 << 20)
    except BlockingIOError:
        return b""


def test_responses_held_in_one_pass_are_written_when_it_ends(pairs):
    outbox = Outbox(gevent.get_hub().loop)
    (a, a_peer), (b, b_peer) = pairs(2)
    seen_during_the_pass = []

    def second():
        # runs in the same pass as first(), after it held its response
        seen_during_the_pass.append(_received(a_peer))
        return outbox.hold(b.fileno(), b"second")

    first = gevent.spawn(outbox.hold, a.fileno(), b"first")
    other = gevent.spawn(second)
    gevent.joinall([first, other], raise_error=True)
    assert seen_during_the_pass == [b""]
    assert (first.value, other.value) == (5, 6)  # write(2)'s counts, handed to each holder
    assert (_received(a_peer), _received(b_peer)) == (b"first", b"second")


class _HeldLoop:
    """A loop that keeps the callbacks it is given, to run when the test says."""

    def __init__(self):
        self.callbacks = []

    def run_callback(self, callback):
        self.callbacks.append(callback)


def test_a_holder_killed_before_the_pass_ends_has_nothing_written(pairs):
    loop = _HeldLoop()
    outbox = Outbox(loop)
    [(ours, peer), (kept, kept_peer)] = pairs(2)
    holder = gevent.spawn(outbox.hold, ours.fileno(), b"never")
    other = gevent.spawn(outbox.hold, kept.fileno(), b"kept")
    gevent.sleep(0)  # both hold and wait
    holder.kill()  # through the hub: the flush has not run
    [flush] = loop.callbacks  # queued by the first hold only
    gevent.get_hub().loop.run_callback(flush)  # in the hub, as the loop runs it
    assert other.get(timeout=5) == 4
    assert (_received(peer), _received(kept_peer)) == (b"", b"kept")


def test_a_failed_write_reaches_the_connection_as_a_disconnect(pairs):
    [(ours, peer)] = pairs(1)
    peer.close()
    transport = Transport(ours, gevent.get_hub().loop, 5.0, Outbox(gevent.get_hub().loop))
    with pytest.raises(ClientDisconnected):
        gevent.spawn(transport.send_response, b"to nobody").get()


def test_the_rest_of_a_short_write_is_sent_by_its_connection(pairs):
    [(ours, peer)] = pairs(1)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    transport = Transport(ours, gevent.get_hub().loop, 5.0, Outbox(gevent.get_hub().loop))
    response = os.urandom(1 << 20)  # far more than the socket buffers take at once
    received = bytearray()

    def read_all():
        from gevent.socket import wait_read
        while len(received) < len(response):
            wait_read(peer.fileno())
            received.extend(_received(peer))

    reader = gevent.spawn(read_all)
    gevent.spawn(transport.send_response, response).get(timeout=10)
    reader.get(timeout=10)
    assert bytes(received) == response


def test_a_process_has_an_outbox_unless_turned_off():
    assert isinstance(outbox_for(settings.parse(["app:app"], environ={})), Outbox)
    assert outbox_for(settings.parse(["--no-batch-responses", "app:app"], environ={})) is None
    assert outbox_for(settings.parse(["app:app"], environ={"FORKSERVE_BATCH_RESPONSES": "0"})) \
        is None
