"""forkserve.http.transport.Outbox: whole responses written at the end of the
event loop's pass (the batch_responses setting), on socket pairs in this process's hub,
and what a connection's Transport does with what their writes leave."""

import os
import socket
import time

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


def _transport(sock, outbox, send_timeout=5.0):
    return Transport(sock, gevent.get_hub().loop, send_timeout, outbox)


def test_responses_held_in_one_pass_are_written_when_it_ends(pairs):
    outbox = Outbox(gevent.get_hub().loop)
    (a, a_peer), (b, b_peer) = pairs(2)
    first, second = _transport(a, outbox), _transport(b, outbox)
    seen_during_the_pass = []

    def answer_second():
        # runs in the same pass as first's greenlet, after it held its response
        seen_during_the_pass.append(_received(a_peer))
        second.send_response(b"second")
        # it goes on without waiting for the write
        seen_during_the_pass.append((_received(b_peer), first.held, second.held))

    gevent.joinall([gevent.spawn(first.send_response, b"first"), gevent.spawn(answer_second)],
                   raise_error=True)
    assert seen_during_the_pass == [b"", (b"", 1, 1)]
    assert (_received(a_peer), _received(b_peer)) == (b"first", b"second")
    assert (first.held, second.held) == (0, 0)


class _HeldLoop:
    """A loop that keeps the callbacks it is given, to run when the test says,
    and makes real watchers."""

    def __init__(self):
        self.callbacks = []
        self.io = gevent.get_hub().loop.io
        self.timer = gevent.get_hub().loop.timer

    def run_callback(self, callback):
        self.callbacks.append(callback)


def test_a_connection_that_closes_writes_what_it_holds_first_and_nothing_after(pairs):
    loop = _HeldLoop()
    outbox = Outbox(loop)
    [(ours, peer), (kept, kept_peer)] = pairs(2)
    closing, other = Transport(ours, loop, 5.0, outbox), Transport(kept, loop, 5.0, outbox)
    closing.send_response(b"said")
    other.send_response(b"kept")
    closing.close()  # before the pass's end: what it holds goes out first
    assert (_received(peer), _received(kept_peer)) == (b"said", b"")
    [end_of_pass] = loop.callbacks  # queued by the first hold only
    end_of_pass()
    assert (_received(peer), _received(kept_peer)) == (b"", b"kept")


def test_a_failed_write_shuts_the_connection_and_its_next_send_is_a_disconnect(pairs):
    [(ours, peer)] = pairs(1)
    peer.shutdown(socket.SHUT_RD)  # our writes fail (EPIPE); the peer could still send
    transport = _transport(ours, Outbox(gevent.get_hub().loop))
    waiting = gevent.spawn(transport.reader.recv, True)  # as for the next request
    gevent.spawn(transport.send_response, b"to nobody").get()
    assert waiting.get(timeout=5) == b""  # woken at EOF by the shutdown
    with pytest.raises(ClientDisconnected):
        transport.send(b"more")
    with pytest.raises(ClientDisconnected):
        transport.send_response(b"more")


def test_the_hub_writes_the_rest_of_a_short_write_and_what_follows_comes_after_it(pairs):
    [(ours, peer)] = pairs(1)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    transport = _transport(ours, Outbox(gevent.get_hub().loop))
    response = os.urandom(1 << 20)  # far more than the socket buffers take at once
    received = bytearray()

    def read(count):
        from gevent.socket import wait_read
        while len(received) < count:
            wait_read(peer.fileno())
            received.extend(_received(peer))

    transport.send_response(response)  # returns at once
    transport.send_response(b"second")  # pipelined: held in the same pass
    gevent.sleep(0)  # the pass ends: a short write, and "second" behind its rest
    assert transport.held == 0 and transport._rest.endswith(b"second")
    reader = gevent.spawn(read, len(response) + 6)
    reader.get(timeout=10)  # no greenlet of the connection ran: the hub wrote the rest
    assert bytes(received) == response + b"second" and transport._rest is None
    del received[:]
    # held again; and a send behind what the client has not taken yet waits for it
    transport.send_response(response)
    gevent.sleep(0)
    reader = gevent.spawn(read, len(response) + 4)
    transport.send(b"next")
    reader.get(timeout=10)
    assert bytes(received) == response + b"next"


def test_what_a_connection_sends_or_streams_comes_after_what_it_holds(pairs):
    [(ours, peer)] = pairs(1)
    transport = _transport(ours, Outbox(gevent.get_hub().loop))
    transport.send_response(b"held;")
    transport.send(b"sent;")  # in the same pass: the held response goes out first
    assert _received(peer) == b"held;sent;"
    with open(__file__, "rb") as f:
        transport.send_response(b"held;")
        transport.sendfile(f.fileno(), 0, 7)
    assert _received(peer) == b'held;"""fork'


def test_a_process_has_an_outbox_unless_turned_off():
    assert isinstance(outbox_for(settings.parse(["app:app"], environ={})), Outbox)
    assert outbox_for(settings.parse(["--no-batch-responses", "app:app"], environ={})) is None
    assert outbox_for(settings.parse(["app:app"], environ={"FORKSERVE_BATCH_RESPONSES": "0"})) \
        is None


def test_a_write_error_not_of_the_clients_doing_is_raised_by_close_once_the_socket_is_closed(pairs):
    import errno
    [(ours, peer), (gone, gone_peer)] = pairs(2)
    transport = _transport(ours, Outbox(gevent.get_hub().loop))
    transport.write_failed(OSError(errno.EIO, "as if the device failed"))
    with pytest.raises(OSError) as raised:
        transport.close()
    assert raised.value.errno == errno.EIO and transport.socket is None
    # the client's doing: nothing raised
    transport = _transport(gone, Outbox(gevent.get_hub().loop))
    transport.write_failed(OSError(errno.ECONNRESET, "reset"))
    transport.close()
    assert transport.socket is None


def _poll_hub(predicate, timeout=10.0):
    """Let the hub run until `predicate()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        gevent.sleep(0.01)


def _slow_reader(peer, count, chunk=16384, every=0.02):
    """A greenlet that takes `count` bytes from `peer`, `chunk` at most every
    `every` seconds (the client's pace), and returns them."""
    def read():
        received = bytearray()
        while len(received) < count:
            gevent.socket.wait_read(peer.fileno(), timeout=10)
            received.extend(peer.recv(chunk))
            gevent.sleep(every)
        return bytes(received)
    return gevent.spawn(read)


HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n"


@pytest.mark.parametrize("batch", [True, False], ids=["held", "sent"])
def test_a_write_goes_on_past_send_timeout_while_the_client_keeps_taking_bytes(pairs, batch):
    [(ours, peer)] = pairs(1)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    transport = _transport(ours, Outbox(gevent.get_hub().loop) if batch else None,
                           send_timeout=0.2)
    response = HEAD + os.urandom(1 << 20)
    reader = _slow_reader(peer, len(response))  # about 1.3 s: six send_timeouts
    started = time.monotonic()
    transport.send_response(response)
    _poll_hub(lambda: transport._rest is None and not transport.held)
    assert reader.get(timeout=20) == response and time.monotonic() - started > 0.6
    assert transport.cut is None and transport._failure is None


def test_the_hub_cuts_a_rest_the_client_stops_taking_and_says_how_much_went(pairs):
    [(ours, peer)] = pairs(1)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    transport = _transport(ours, Outbox(gevent.get_hub().loop), send_timeout=0.2)
    transport.line = "GET /big HTTP/1.1"
    body = os.urandom(1 << 20)
    transport.send_response(HEAD + body)
    waiting = gevent.spawn(transport.reader.recv, True)  # as for the next request
    _poll_hub(lambda: transport.cut is not None)  # the client read nothing
    line, sent, total, reason = transport.cut
    assert (line, total, reason) == ("GET /big HTTP/1.1", len(body),
                                     "the client took no byte for 0.2 s (--send-timeout)")
    assert waiting.get(timeout=5) == b""  # the connection was shut down: it wakes
    received = bytearray()
    while data := peer.recv(1 << 20) if _poll_readable(peer) else b"":
        received.extend(data)
    assert bytes(received) == (HEAD + body)[:len(HEAD) + sent]
    with pytest.raises(ClientDisconnected, match="took no byte"):
        transport.settle()


def _poll_readable(sock):
    gevent.socket.wait_read(sock.fileno(), timeout=5)
    return True


def test_a_send_the_client_stops_taking_is_cut_after_send_timeout_and_says_what_is_left(pairs):
    [(ours, peer)] = pairs(1)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    transport = _transport(ours, None, send_timeout=0.2)
    data = os.urandom(1 << 20)
    with pytest.raises(ClientDisconnected, match="took no byte for 0.2 s") as raised:
        transport.send(data)
    unsent = raised.value.unsent
    assert 0 < unsent < len(data)
    received = bytearray()
    while len(received) < len(data) - unsent:
        gevent.socket.wait_read(peer.fileno(), timeout=5)
        received.extend(peer.recv(1 << 20))
    assert bytes(received) == data[:len(data) - unsent]


def test_the_keep_alive_wait_counts_from_when_the_hub_wrote_the_last_byte(pairs):
    [(ours, peer)] = pairs(1)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    loop = gevent.get_hub().loop
    transport = _transport(ours, Outbox(loop))
    assert transport.idle_left(5.0) <= 0  # nothing written late: the wait began when it did
    response = os.urandom(1 << 20)
    transport.send_response(response)
    assert transport.idle_left(5.0) == 5.0  # held
    gevent.sleep(0)
    assert transport._rest is not None and transport.idle_left(5.0) == 5.0  # being written
    reader = _slow_reader(peer, len(response), chunk=65536, every=0.01)
    _poll_hub(lambda: transport._rest is None)
    finished = loop.now()
    assert reader.get(timeout=10) == response
    assert 4.0 < transport.idle_left(5.0) <= 5.0 - (loop.now() - finished)
