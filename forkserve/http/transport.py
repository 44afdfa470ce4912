"""The socket side of one connection: reads, sends bounded by send_timeout,
timers that interrupt a wait on the client, and the lingering close; and a
process's Outbox, which writes whole responses at the end of the event
loop's pass (unless --no-batch-responses).
forkserve.http.handler drives a forkserve.http.protocol.Connection with it.

Invariants: a timer only ever interrupts a wait on this connection's socket
(it is armed just around the wait and stopped right after, with no switch in
between), so it never fires inside application code; a send that the client
does not let finish within send_timeout, or that fails because the client is
gone, becomes ClientDisconnected and the connection is closed.

A response held in the Outbox is written, in one write(2), before the loop
next polls; its greenlet goes on without waiting. What the connection sends
next, and its close, come after it: they first settle() the connection, which
writes what it still holds at once and then what the client has not taken
yet, under send_timeout, raising ClientDisconnected if a write failed.
Between the two, the hub writes a short write's rest as the client reads it,
and a write that fails shuts the connection down, so that a greenlet waiting
for the next request wakes (at EOF). A held response is never written after
its connection closed: close() settles first.
"""

import errno
import os
from socket import SHUT_RDWR, SHUT_WR

from gevent import getcurrent, get_hub
from gevent.socket import wait_write

from forkserve.http.h1 import ClientDisconnected

__all__ = ["Transport", "Reader", "Outbox", "Expired", "READ_BUFFER", "GONE_ERRNOS", "timer"]

#: Bytes read from the socket at a time.
READ_BUFFER = 16384

#: After a refusal or an unread body, keep reading (and discarding) for this
#: long / this much before closing, so the client gets our response, not a
#: TCP reset triggered by its unread data (the "lingering close" of nginx).
LINGER_SECONDS = 1.0
LINGER_BYTES = 1 << 20

# errnos that only mean "the client went away"; anything else is a real error.
# EBADF is not among them: a descriptor closed under a connection is a bug of
# ours, to be raised (and logged with its traceback), not counted as a client.
GONE_ERRNOS = frozenset({
    errno.EPIPE, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT,
    errno.ENOTCONN, errno.ESHUTDOWN,
})


class Expired(BaseException):
    """Thrown into a connection's greenlet by one of its timers."""


class Transport:
    """One accepted socket, its reader, its send timer and its close.

    `linger` asks close() to read (and drop) what the client still sends for
    a moment first: set it when the client's request was not read to its end.
    """

    def __init__(self, sock, loop, send_timeout, outbox=None):
        self.socket = sock
        self.loop = loop
        self.outbox = outbox  # the process's Outbox, None with --no-batch-responses
        self._fd = sock.fileno()
        self.reader = Reader(self._fd, loop)
        self.linger = False
        self.throw = getcurrent().throw
        self._send_timeout = send_timeout
        # made by the first send that the socket does not take whole: most
        # connections never need it (one per connection cost a libev timer
        # and its close to every new connection)
        self._send_timer = None
        # what the Outbox left for settle(): responses it holds, the rest of
        # a short write (written by the hub as the client reads, through
        # _writable, made when first needed), the OSError a write met
        self.held = 0
        self._rest = None
        self._writable = None
        self._failure = None

    def read_now(self):
        """What the client already sent, without waiting: its bytes, b"" once
        it has closed, or None if nothing has arrived (or the read failed, which
        the next wait on the socket will meet again)."""
        try:
            return self.reader.read_now()
        except OSError:
            return None

    def sendfile(self, fileno, offset, count):
        """Send `count` bytes of the file `fileno` from `offset`, under send_timeout."""
        if self.held or self._rest is not None or self._failure is not None:
            self.settle()
        self.guarded(self._sendfile, fileno, offset, count)

    def _sendfile(self, fileno, offset, count):
        out = self.socket.fileno()
        while count > 0:
            try:
                sent = os.sendfile(out, fileno, offset, count)
            except BlockingIOError:
                wait_write(out)
                continue
            if sent == 0:
                break  # the file shrank
            offset += sent
            count -= sent

    def send(self, data):
        """Send all of `data`: one write(2) when the socket takes it all (the
        usual case: no timer, no SO_SNDBUF query as in gevent's sendall);
        the rest, if any, waits for the client under send_timeout."""
        if self.held or self._rest is not None or self._failure is not None:
            self.settle()
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise
            raise ClientDisconnected("client went away during the response") from ex
        if sent < len(data):
            self.guarded(self.socket.sendall, memoryview(data)[sent:])

    def send_response(self, data):
        """Send a whole response, `data`, as send() does; with an Outbox,
        hold it there, to be written with the other responses of the loop's
        pass at its end, and return at once."""
        outbox = self.outbox
        if outbox is None:
            return self.send(data)
        if self._rest is not None or self._failure is not None:
            self.settle()
        outbox.hold(self, data)

    def settle(self):
        """Write what the Outbox holds for this connection now, then wait for
        the client to take what it left (under send_timeout): afterwards every
        earlier response is sent. ClientDisconnected if the client is gone
        or did not read in time."""
        if self.held:
            self.outbox.release(self)
        rest = self._rest
        if rest is not None:
            self._rest = None
            self._writable.stop()
            self.guarded(self.socket.sendall, rest)
        failure = self._failure
        if failure is not None:
            if failure.errno not in GONE_ERRNOS:
                raise failure
            raise ClientDisconnected("client went away during the response") from failure

    def write_held(self, data):
        """From the Outbox: write `data`, a response it held, now. What the
        socket does not take, the hub writes as the client reads it."""
        self.held -= 1
        rest = self._rest
        if rest is not None:  # behind what the client has not taken yet
            rest += data
            return
        if self._failure is not None:
            return
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as ex:
            self.write_failed(ex)
            return
        if sent < len(data):
            self._rest = bytearray(memoryview(data)[sent:])
            writable = self._writable
            if writable is None:
                writable = self._writable = self.loop.io(self._fd, 2)
            writable.start(self._write_rest)

    def write_failed(self, ex):
        """From the Outbox or the hub's writer: a write met `ex`. settle() raises
        it (close() too, once the socket is closed, if it is not the client's
        doing); the connection is shut down now, so that a greenlet waiting
        for the next request wakes."""
        self._failure = ex
        self._rest = None
        if self._writable is not None:
            self._writable.stop()
        try:
            self.abort()
        except OSError:  # the failure itself is what settle() reports
            pass

    def _write_rest(self):
        rest = self._rest
        try:
            sent = os.write(self._fd, rest)
        except BlockingIOError:
            return
        except OSError as ex:
            self.write_failed(ex)
            return
        del rest[:sent]
        if not rest:
            self._rest = None
            self._writable.stop()

    def guarded(self, send, *args):
        """Run a send under send_timeout; a client that is gone or does not
        read becomes ClientDisconnected."""
        expiry = self._send_timer
        if expiry is None:
            expiry = self._send_timer = timer(self.loop, self._send_timeout)
        try:
            if expiry is not None:
                expiry.again(self.throw, Expired)
            send(*args)
        except Expired:
            raise ClientDisconnected("client did not read the response within send_timeout") \
                from None
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise
            raise ClientDisconnected("client went away during the response") from ex
        finally:
            if expiry is not None:
                expiry.stop()

    def abort(self):
        """Shut the connection down; a greenlet blocked on it wakes (a read sees EOF,
        a send EPIPE)."""
        sock = self.socket
        if sock is not None:
            try:
                sock.shutdown(SHUT_RDWR)
            except OSError as ex:
                if ex.errno not in GONE_ERRNOS:
                    raise

    def close(self):
        sock = self.socket
        if sock is None:
            return
        error = None
        try:
            if self.held or self._rest is not None or self._failure is not None:
                self.settle()  # what was said goes out before the close
        except ClientDisconnected:
            self.linger = False  # nobody left to linger for
        except OSError as ex:  # not the client's doing: raised once the socket is closed
            self.linger = False
            error = ex
        finally:
            if self._writable is not None:
                self._writable.close()
        if self._send_timer is not None:
            self._send_timer.close()
        if self.linger:
            linger = timer(self.loop, LINGER_SECONDS)
            try:
                linger.again(self.throw, Expired)
                try:
                    self._linger_read()
                finally:
                    linger.stop()
            except Expired:
                pass
            finally:
                linger.close()
        self.reader.close()
        sock.close()
        self.socket = None
        self.throw = None  # the greenlet's: what still holds this transport (an
        # environ the application kept) does not keep the greenlet
        if error is not None:
            raise error

    def _linger_read(self):
        sock = self.socket
        try:
            sock.shutdown(SHUT_WR)
            received = 0
            while received < LINGER_BYTES:
                data = sock.recv(65536)
                if not data:
                    break
                received += len(data)
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise


class Reader:
    """The connection's reads: what one os.read() of the non-blocking socket
    brings, waiting for readability when nothing has come. It keeps no
    bytes: what it reads goes to the connection object
    (forkserve.http.protocol.Connection), whose buffer is the connection's
    only one."""

    __slots__ = ("_fd", "_readable", "_wait")

    def __init__(self, fd, loop):
        self._fd = fd
        self._readable = loop.io(fd, 1)
        self._wait = get_hub().wait

    def recv(self, wait_first=False):
        """One read's bytes, waiting for them (b"" at EOF). `wait_first`:
        nothing is expected yet, so wait for readability before trying (a
        keep-alive connection waiting for its next request)."""
        if wait_first:
            self._wait(self._readable)
        while True:
            try:
                return os.read(self._fd, READ_BUFFER)
            except BlockingIOError:
                self._wait(self._readable)

    def read_now(self):
        """One read's bytes without waiting: b"" at EOF, None if nothing has
        arrived."""
        try:
            return os.read(self._fd, READ_BUFFER)
        except BlockingIOError:
            return None

    def close(self):
        self._readable.close()


class Outbox:
    """Whole responses held until the event loop's pass ends, then written
    back to back, one write(2) each (the batch_responses setting).

    Every response written wakes the client if it sleeps waiting for one. A
    load generator or a proxy that answers quickly is asleep again before
    the next response, so a process that writes each response as it is made
    wakes it once per request, and on a virtual machine a wake-up on another
    CPU is an interrupt through the hypervisor: on a 2-vCPU VM, 9-10 µs of
    the writing process's CPU per PersonDB request (perf: the kernel's
    sock_def_readable). Written together, the responses of one pass wake it
    once. A response waits at most for the rest of its pass; its greenlet
    does not wait at all (two greenlet switches per request fewer), and
    Transport.settle() deals with what the write did.
    """

    def __init__(self, loop):
        self._loop = loop
        self._held = []  # (transport, data) in the order held

    def hold(self, transport, data):
        """Hold `data`, a whole response of `transport`'s, until the pass ends."""
        held = self._held
        if not held:
            # gevent runs its callbacks before the loop polls
            self._loop.run_callback(self.write_held)
        transport.held += 1
        held.append((transport, data))

    def release(self, transport):
        """Write what is held for `transport` now, in order (its settle())."""
        mine = [data for holder, data in self._held if holder is transport]
        # the pass's callback, already queued, finds what is left
        self._held = [entry for entry in self._held if entry[0] is not transport]
        for data in mine:
            transport.write_held(data)

    def write_held(self):
        """Write what is held now (from the hub: a loop callback, a CPU turn's
        end)."""
        held, self._held = self._held, []
        for transport, data in held:
            transport.write_held(data)


def timer(loop, seconds):
    """A loop timer, or None for 0 seconds. Armed with again(),
    which restarts the full interval: libev's stop() keeps only the time
    *remaining*, so a timer reused with start() would count down across
    requests and expire on a busy keep-alive connection."""
    return loop.timer(seconds, seconds) if seconds else None
