"""The socket side of one connection: reads, sends bounded by send_timeout,
timers that interrupt a wait on the client, and the lingering close; and a
process's Outbox, which writes whole responses at the end of the event
loop's pass (unless --no-batch-responses).
forkserve.http.handler drives a forkserve.http.protocol.Connection with it.

Invariants: a timer only ever interrupts a wait on this connection's socket
(it is armed just around the wait and stopped right after, with no switch in
between), so it never fires inside application code; a send whose client
takes no byte for send_timeout, or that fails because the client is gone,
becomes ClientDisconnected and the connection is closed.

A response held in the Outbox is written, in one write(2), before the loop
next polls; its greenlet goes on without waiting. What the connection sends
next, and its close, come after it: they first settle() the connection, which
writes what it still holds at once and then what the client has not taken
yet (as long as it takes bytes), raising ClientDisconnected if a write failed.
Between the two, the hub writes a short write's rest as the client reads it,
and a write that fails shuts the connection down, so that a greenlet waiting
for the next request wakes (at EOF). A held response is never written after
its connection closed: close() settles first.

send_timeout bounds a stall, not a write: every write that has to wait
(this greenlet's, the hub's of a rest, sendfile's) may go on as long as the
client takes bytes, and fails once it has taken none for send_timeout
(judged, when the timer runs, by what the client's TCP acknowledged: a
writer is woken only once much of the send buffer is free). The hub's
callbacks (the writer, its stall timer) write, shut the socket down and
stop watchers; they never switch. The
keep-alive wait counts from when the last response was written whole:
`idle_left` says how much of it remains (the hub's rest may end long after
the response was held). A response cut (a stall, a client gone) is recorded
in `cut` for the log: its request line and how much of its body went out.
"""

import errno
import os
import struct
from socket import IPPROTO_TCP, SHUT_RDWR, SHUT_WR, TCP_INFO

from gevent import getcurrent, get_hub

from forkserve.http.h1 import ClientDisconnected

__all__ = ["Transport", "Reader", "Outbox", "Expired", "SendStalled", "READ_BUFFER",
           "GONE_ERRNOS", "timer"]

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


# struct tcp_info (linux/tcp.h): tcpi_bytes_acked, a u64 at byte 120 (Linux 4.2+)
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_AT = 120
_TCP_INFO_SIZE = _BYTES_ACKED_AT + _BYTES_ACKED.size


class Expired(BaseException):
    """Thrown into a connection's greenlet by one of its timers."""


class SendStalled(TimeoutError):
    """A write whose client took no byte for send_timeout."""


def _reason(ex):
    """Why a write failed, for the line that logs the response it cut."""
    if isinstance(ex, SendStalled):
        return ex.strerror
    name = errno.errorcode.get(ex.errno, ex.errno)
    if ex.errno in GONE_ERRNOS:
        return f"the client went away ({name})"
    return f"the write failed ({name}: {ex.strerror})"


class Transport:
    """One accepted socket, its reader, its send timer and its close.

    `linger` asks close() to read (and drop) what the client still sends for
    a moment first: set it when the client's request was not read to its end.
    `line` is the request line of the response being sent (set by the
    responder), `cut` once a response was cut: (request line, body bytes
    sent, body bytes in all or None, why), for the log.
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
        # made by the first write that the socket does not take whole: most
        # connections never need it (one per connection cost a libev timer
        # and its close to every new connection)
        self._stall = None
        # what the Outbox left for settle(): responses it holds, the rest of
        # a short write (written by the hub as the client reads, through
        # _writable, made when first needed) and the held responses it is
        # made of (_pending), the OSError a write met
        self.held = 0
        self._rest = None
        self._pending = None
        self._writable = None
        self._failure = None
        # loop time when the hub wrote the last of a rest: the keep-alive
        # wait counts from then (idle_left)
        self._written_at = 0.0
        # bytes of this greenlet's current write not yet taken, for the cut's count
        self._unsent = 0
        # the peer's acknowledged bytes when the stall timer last looked
        self._acked = 0
        self.line = None
        self.cut = None

    def read_now(self):
        """What the client already sent, without waiting: its bytes, b"" once
        it has closed, or None if nothing has arrived (or the read failed, which
        the next wait on the socket will meet again)."""
        try:
            return self.reader.read_now()
        except OSError:
            return None

    def idle_left(self, keep_alive):
        """Seconds of the keep-alive wait still to go, counted from when the
        last response was written whole; `keep_alive` while the hub is still
        writing one (or one is held)."""
        if self.held or self._rest is not None:
            return keep_alive
        return self._written_at + keep_alive - self.loop.now()

    def sendfile(self, fileno, offset, count):
        """Send `count` bytes of the file `fileno` from `offset`, as long as
        the client keeps taking them (see guarded)."""
        if self.held or self._rest is not None or self._failure is not None:
            self.settle()
        self.guarded(self._sendfile, fileno, offset, count)

    def _sendfile(self, fileno, offset, count):
        out = self._fd
        self._unsent = count
        while count > 0:
            try:
                sent = os.sendfile(out, fileno, offset, count)
            except BlockingIOError:
                self._wait_writable()
                continue
            if sent == 0:
                break  # the file shrank
            offset += sent
            count -= sent
            self._progress(sent)

    def send(self, data):
        """Send all of `data`: one write(2) when the socket takes it all (the
        usual case: no timer, no SO_SNDBUF query as in gevent's sendall);
        the rest, if any, as the client takes it (see guarded)."""
        if self.held or self._rest is not None or self._failure is not None:
            self.settle()
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise
            self._unsent = len(data)
            raise self._disconnected(_reason(ex)) from ex
        if sent < len(data):
            self._unsent = len(data) - sent
            self.guarded(self._send_rest, memoryview(data)[sent:], self._progress)

    def _send_rest(self, view, took):
        """Write all of `view` from this greenlet as the client takes it;
        took(bytes) counts each write and restarts the stall timer."""
        fd = self._fd
        while view:
            try:
                sent = os.write(fd, view)
            except BlockingIOError:
                self._wait_writable()
                continue
            view = view[sent:]
            took(sent)

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
        the client to take what it left (as long as it keeps taking bytes):
        afterwards every earlier response is sent. ClientDisconnected if the
        client is gone or stalled past send_timeout."""
        if self.held:
            self.outbox.release(self)
        if self._rest is not None:
            self._finish_rest()
        failure = self._failure
        if failure is not None:
            if failure.errno not in GONE_ERRNOS:
                raise failure
            raise ClientDisconnected(_reason(failure)) from failure

    def write_held(self, data, line):
        """From the Outbox: write `data`, a response it held (for the request
        `line`), now. What the socket does not take, the hub writes as the
        client reads it, and fails once the client has taken nothing for
        send_timeout."""
        self.held -= 1
        rest = self._rest
        if rest is not None:  # behind what the client has not taken yet
            rest += data
            self._pending.append(_held(line, data, 0))
            return
        if self._failure is not None:
            return
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as ex:
            self._pending = [_held(line, data, 0)]
            self.write_failed(ex)
            return
        if sent < len(data):
            self._rest = bytearray(memoryview(data)[sent:])
            self._pending = [_held(line, data, sent)]
            writable = self._writable
            if writable is None:
                writable = self._writable = self.loop.io(self._fd, 2)
            writable.start(self._write_rest)
            self._arm_stall(self._stalled)

    def write_failed(self, ex):
        """From the Outbox or the hub's writer: a write met `ex`. settle() raises
        it (close() too, once the socket is closed, if it is not the client's
        doing); the connection is shut down now, so that a greenlet waiting
        for the next request wakes."""
        self._failure = ex
        if self._pending:
            line, head, size, written = self._pending[0]
            self.cut = (line, max(0, written - head), size - head, _reason(ex))
        self._rest = self._pending = None
        if self._writable is not None:
            self._writable.stop()
        if self._stall is not None:
            self._stall.stop()
        try:
            self.abort()
        except OSError:  # the failure itself is what settle() reports
            pass

    def _write_rest(self):
        """The hub's writer of a rest (an io watcher's callback)."""
        rest = self._rest
        try:
            sent = os.write(self._fd, rest)
        except BlockingIOError:
            return
        except OSError as ex:
            self.write_failed(ex)
            return
        del rest[:sent]
        self._took(sent)
        stall = self._stall
        if rest:
            if stall is not None:
                stall.again(self._stalled)  # a byte taken: a new send_timeout
            return
        self._rest = self._pending = None
        self._writable.stop()
        if stall is not None:
            stall.stop()
        self._written_at = self.loop.now()

    def _stalled(self):
        """The hub's writer's stall timer ran out (a timer's callback)."""
        if self._client_took():
            self._stall.again(self._stalled)
        else:
            self.write_failed(self._stall_error())

    def _stalled_waiting(self):
        """The stall timer of a write this greenlet waits on ran out (a
        timer's callback, run while the greenlet waits for writability)."""
        if self._client_took():
            self._stall.again(self._stalled_waiting)
        else:
            self.throw(Expired)

    def _finish_rest(self):
        """Write the rest the hub was writing from this greenlet, as long as
        the client keeps taking bytes; a failure is left for settle()."""
        self._writable.stop()
        stall = self._arm_stall(self._stalled_waiting)
        try:
            self._send_rest(memoryview(self._rest), self._took_waiting)
        except Expired:
            self.write_failed(self._stall_error())
            return
        except OSError as ex:
            self.write_failed(ex)
            return
        finally:
            if stall is not None:
                stall.stop()
        self._rest = self._pending = None

    def _took_waiting(self, sent):
        """_took, from this greenlet: and a new send_timeout."""
        self._took(sent)
        stall = self._stall
        if stall is not None:
            stall.again(self._stalled_waiting)

    def _took(self, sent):
        """The client took `sent` more bytes of the rest: count them against
        the held responses it is made of, oldest first."""
        pending = self._pending
        while sent and pending:
            entry = pending[0]
            step = min(sent, entry[2] - entry[3])
            entry[3] += step
            sent -= step
            if entry[3] == entry[2]:
                del pending[0]

    def guarded(self, send, *args):
        """Run a send from this greenlet; it goes on as long as the client
        takes bytes (send calls _progress for each write) and becomes
        ClientDisconnected once the client has taken none for send_timeout,
        or is gone."""
        stall = self._arm_stall(self._stalled_waiting)
        try:
            send(*args)
        except Expired:
            raise self._disconnected(self._stall_error().strerror) from None
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise
            raise self._disconnected(_reason(ex)) from ex
        finally:
            if stall is not None:
                stall.stop()

    def _progress(self, sent):
        """A write from this greenlet took `sent` bytes: a new send_timeout."""
        self._unsent -= sent
        stall = self._stall
        if stall is not None:
            stall.again(self._stalled_waiting)

    def _disconnected(self, reason):
        """ClientDisconnected for a send from this greenlet; its `unsent` is
        how many bytes of that send did not go out."""
        ex = ClientDisconnected(reason)
        ex.unsent = self._unsent
        return ex

    def _arm_stall(self, callback):
        """Start the stall timer (None with send_timeout 0) for a write that
        waits for the client, counting what its kernel has taken so far."""
        stall = self._stall
        if stall is None:
            if not self._send_timeout:
                return None
            stall = self._stall = timer(self.loop, self._send_timeout)
        self._acked = self._acked_bytes() or 0
        stall.again(callback)
        return stall

    def _client_took(self):
        """True if the client's kernel acknowledged bytes since the last look.
        A write does not finish each time the client takes a few bytes: the
        kernel wakes a writer once a good part of the send buffer (MiBs on a
        fast link) is free, which at a slow reader's pace can take longer
        than send_timeout, though the client never stopped reading."""
        acked = self._acked_bytes()
        if acked is None or acked <= self._acked:
            return False
        self._acked = acked
        return True

    def _acked_bytes(self):
        """Bytes of ours the peer's TCP acknowledged (Linux's
        tcpi_bytes_acked), or None where that cannot be read (a Unix socket)."""
        try:
            info = self.socket.getsockopt(IPPROTO_TCP, TCP_INFO, _TCP_INFO_SIZE)
        except OSError:
            return None
        if len(info) < _TCP_INFO_SIZE:
            return None
        return _BYTES_ACKED.unpack_from(info, _BYTES_ACKED_AT)[0]

    def _stall_error(self):
        return SendStalled(errno.ETIMEDOUT, f"the client took no byte for "
                                            f"{self._send_timeout:g} s (--send-timeout)")

    def _wait_writable(self):
        writable = self._writable
        if writable is None:
            writable = self._writable = self.loop.io(self._fd, 2)
        get_hub().wait(writable)

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
        if self._stall is not None:
            self._stall.close()
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


def _held(line, data, written):
    """What the hub's writer counts of a held response in its rest: [request
    line, head length, size, bytes written]."""
    head = data.find(b"\r\n\r\n", 0, 65536)
    return [line, head + 4 if head >= 0 else 0, len(data), written]


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
        held.append((transport, data, transport.line))

    def release(self, transport):
        """Write what is held for `transport` now, in order (its settle())."""
        mine = [entry for entry in self._held if entry[0] is transport]
        # the pass's callback, already queued, finds what is left
        self._held = [entry for entry in self._held if entry[0] is not transport]
        for _, data, line in mine:
            transport.write_held(data, line)

    def write_held(self):
        """Write what is held now (from the hub: a loop callback, a CPU turn's
        end)."""
        held, self._held = self._held, []
        for transport, data, line in held:
            transport.write_held(data, line)


def timer(loop, seconds):
    """A loop timer, or None for 0 seconds. Armed with again(),
    which restarts the full interval: libev's stop() keeps only the time
    *remaining*, so a timer reused with start() would count down across
    requests and expire on a busy keep-alive connection."""
    return loop.timer(seconds, seconds) if seconds else None
