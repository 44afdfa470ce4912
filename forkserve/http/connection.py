"""The socket side of one connection: buffered reads, sends bounded by
send_timeout, timers that interrupt a wait on the client, and the lingering
close. forkserve.http.handler.Handler builds the HTTP request/response loop
on top of it.

Invariants: a timer only ever interrupts a wait on this connection's socket
(it is armed just around the wait and stopped right after, with no switch in
between), so it never fires inside application code; a send that the client
does not let finish within send_timeout, or that fails because the client is
gone, becomes ClientDisconnected and the connection is closed.
"""

import os
from socket import SHUT_RDWR, SHUT_WR

from gevent import getcurrent, get_hub
from gevent.socket import wait_write

from forkserve.http.h1 import (_Expired, ClientDisconnected, GONE_ERRNOS, LINGER_BYTES,
                               LINGER_SECONDS, REASONS)

__all__ = ["Connection", "Reader", "READ_BUFFER"]

#: Bytes read from the socket at a time into the connection's buffer.
READ_BUFFER = 16384


class Connection:
    """One accepted socket, its read buffer (`rfile`) and its timers."""

    def __init__(self, sock, address, server):
        self.socket = sock
        self.client_address = address
        self.server = server
        self._fd = sock.fileno()
        self.rfile = Reader(self._fd, server.loop)
        self._linger = False
        self._throw = getcurrent().throw
        limits = server.limits
        self._head_timer = _timer(server.loop, limits.header_timeout)
        self._idle_timer = _timer(server.loop, limits.keep_alive)
        self._send_timer = _timer(server.loop, limits.send_timeout)

    def _buffered(self):
        """What the client already sent and nobody read yet, without waiting."""
        try:
            return self.rfile.buffered()
        except OSError:
            return b""

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

    def _send(self, data):
        """Send all of `data`: one write(2) when the socket takes it all (the
        usual case: no timer, no SO_SNDBUF query as in gevent's sendall);
        the rest, if any, waits for the client under send_timeout."""
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise
            raise ClientDisconnected("client went away during the response") from ex
        if sent < len(data):
            self._guarded(self.socket.sendall, memoryview(data)[sent:])

    def _guarded(self, send, *args):
        """Run a send under send_timeout; a client that is gone or does not
        read becomes ClientDisconnected."""
        timer = self._send_timer
        try:
            if timer is not None:
                timer.again(self._throw, _Expired)
            send(*args)
        except _Expired:
            raise ClientDisconnected("client did not read the response within send_timeout") \
                from None
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise
            raise ClientDisconnected("client went away during the response") from ex
        finally:
            if timer is not None:
                timer.stop()

    def _send_error(self, status):
        body = REASONS[status].encode()
        head = (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        try:
            self._send(head.encode() + body)
        except ClientDisconnected:
            pass

    # -- timers, closing, logging

    def _arm(self, timer):
        if timer is not None:
            timer.again(self._throw, _Expired)

    @staticmethod
    def _disarm(timer):
        if timer is not None:
            timer.stop()

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

    def _close(self):
        sock = self.socket
        if sock is None:
            return
        if self._linger:
            timer = _timer(self.server.loop, LINGER_SECONDS)
            try:
                self._arm(timer)
                try:
                    self._linger_read()
                finally:
                    self._disarm(timer)
            except _Expired:
                pass
            finally:
                timer.close()
        self.rfile.close()
        sock.close()
        self.socket = None

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

    def _peer(self):
        address = self.client_address
        return address[0] if isinstance(address, tuple) and address else "unix"


class Reader:
    """The connection's read buffer: read(n), readline(limit) and peek(n) as
    io.BufferedReader has them, over os.read() on the non-blocking socket.

    One read(2) per refill: when the caller expects nothing to be there yet
    (`wait_first`: a keep-alive connection waiting for its next request),
    it waits for readability first instead of trying a read that fails with
    EAGAIN. Unread bytes stay in `_data` from `_pos` on (no copy per line).
    """

    __slots__ = ("_fd", "_data", "_pos", "_readable", "_wait")

    def __init__(self, fd, loop):
        self._fd = fd
        self._data = b""
        self._pos = 0
        self._readable = loop.io(fd, 1)
        self._wait = get_hub().wait

    def _fill(self, wait_first=False):
        """Append one read's bytes to the buffer; False at EOF."""
        if wait_first:
            self._wait(self._readable)
        while True:
            try:
                chunk = os.read(self._fd, READ_BUFFER)
                break
            except BlockingIOError:
                self._wait(self._readable)
        if not chunk:
            return False
        pos = self._pos
        self._data = self._data[pos:] + chunk if pos < len(self._data) else chunk
        self._pos = 0
        return True

    def buffered(self):
        """What is buffered, or what one read gets without waiting (b"" if nothing)."""
        if self._pos == len(self._data):
            try:
                chunk = os.read(self._fd, READ_BUFFER)
            except BlockingIOError:
                return b""
            self._data, self._pos = chunk, 0
        return self._data[self._pos:]

    def head_lines(self, size_max):
        """If a whole request head of at most `size_max` bytes is buffered,
        consume it and return its lines as readline() would have (each with
        its line end, the blank line last); else None, nothing consumed.
        With `size_max` no more than any line limit, no line can be over
        its limit, so the caller parses the lines as it parses readline()'s.
        """
        data, pos = self._data, self._pos
        end = data.find(b"\r\n\r\n", pos, pos + size_max)
        if end < 0:
            return None
        head = data[pos:end + 4]
        if head.count(b"\r") != head.count(b"\r\n"):
            return None  # a bare CR: splitlines() would split where readline() does not
        self._pos = end + 4
        return head.splitlines(True)

    def peek(self, size=1, wait_first=False):
        """At least one byte (b"" at EOF), waiting for it if none is buffered."""
        if self._pos == len(self._data) and not self._fill(wait_first):
            return b""
        return self._data[self._pos:]

    def readline(self, limit=-1):
        """Up to and including the next LF, at most `limit` bytes (fewer at EOF)."""
        while True:
            data, pos = self._data, self._pos
            end = len(data) if limit is None or limit < 0 else min(len(data), pos + limit)
            found = data.find(b"\n", pos, end)
            if found >= 0:
                end = found + 1
            elif end == len(data) and (limit is None or limit < 0 or len(data) - pos < limit):
                if self._fill():
                    continue
            self._pos = end
            return data[pos:end]

    def read(self, size=-1):
        """`size` bytes, fewer only at EOF; size < 0 reads to EOF."""
        data, pos = self._data, self._pos
        if 0 <= size <= len(data) - pos:
            self._pos = pos + size
            return data[pos:pos + size]
        parts = [data[pos:]]
        have = len(data) - pos
        self._data, self._pos = b"", 0
        while size < 0 or have < size:
            if not self._fill():
                break
            chunk = self._data
            if size >= 0 and have + len(chunk) > size:
                chunk = chunk[:size - have]
                self._pos = len(chunk)
            else:
                self._data = b""
            parts.append(chunk)
            have += len(chunk)
        return b"".join(parts)

    def close(self):
        self._readable.close()
        self._data, self._pos = b"", 0


def _timer(loop, seconds):
    """A loop timer for _arm(), or None for 0 seconds. Armed with again(),
    which restarts the full interval: libev's stop() keeps only the time
    *remaining*, so a timer reused with start() would count down across
    requests and expire on a busy keep-alive connection."""
    return loop.timer(seconds, seconds) if seconds else None
