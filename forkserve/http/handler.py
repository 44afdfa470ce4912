"""One HTTP/1.x connection of a forkserve worker: read a request, run the WSGI
application (PEP 3333), send the response, repeat while keep-alive allows.

gevent provides the socket, the greenlet this runs in and the loop's timers;
everything HTTP is here or in forkserve.http.h1 (the grammar, which does no
I/O). Nothing here subclasses or reaches into a gevent class.

Invariants, and why:

- The application sees a request only after its request line and every header
  field matched the RFC 9112 grammar and its body framing is unambiguous
  (Content-Length xor chunked, exactly once). Anything else is refused with a
  4xx/5xx and the connection is closed: a proxy in front may have framed the
  same bytes differently, and whatever we read next could be a smuggled request.
- A refused connection is never read from again as HTTP. Its close lingers
  briefly (LINGER_SECONDS) so the client reads the error instead of a reset.
- Every response after which the connection closes says `Connection: close`:
  the decision is made once, when the response head is built
  (`_keep_alive`), and never changed afterwards except by an error that cuts
  the response short. A connection is reused only if the request body was
  consumed to its exact end and the response was framed exactly.
- Draining (reload, stop, --max-requests reached): the next response on every
  connection says `Connection: close`, unless the client already sent another
  request on it (pipelined), which is answered too. Idle connections are not
  closed early: the client may be sending its next request right now; they
  close after `keep_alive` idle seconds like any other, and the server's
  graceful timeout force-closes what remains.
- Timers bound every wait on the client, and none runs while the application
  does: idle (keep_alive) between requests, header_timeout from a request's
  first byte (or the connection's start) to its last header line,
  body_timeout for the whole request body from the application's first read,
  send_timeout for each send of the response.
- One response is one send where possible: head and body joined when the
  application returns a list (the usual case), head and first chunk joined
  when it returns an iterator.
"""

import logging
import os
import re
import stat
import time
from socket import SHUT_RDWR, SHUT_WR
from urllib.parse import unquote

from gevent import getcurrent, sleep
from gevent import Timeout
from gevent.socket import wait_write

from forkserve.http.h1 import (  # the grammar; re-exported names are in __all__
    _Expired, BLANK_LINES, Body, body_framing,
    chunk_size, ClientDisconnected, escape, GONE_ERRNOS, header_field,
    Limits, LINGER_BYTES, LINGER_SECONDS, REASONS, request_line, request_target,
    RequestError, TCHAR, valid_host, DISCARD_BYTES,
)

__all__ = ["Limits", "Handler", "FileWrapper", "RequestError", "ClientDisconnected",
           "ApplicationError", "request_line", "header_field", "body_framing", "chunk_size",
           "escape"]

IDLE, HEAD, BUSY = "idle", "head", "busy"

#: Bytes read from the socket at a time into the connection's buffer.
READ_BUFFER = 16384

#: A connection yields to the event loop after this many requests in a row.
#: gevent only switches greenlets when a socket would block, and a client
#: that pipelines keeps data waiting: without the yield its greenlet ran for
#: seconds, starving the other connections and the worker's heartbeat, and
#: the master killed the "blocked" worker (connections reset mid-blast).
YIELD_EVERY = 16

_NAME = re.compile(f"[{TCHAR}]+")
_VALUE = re.compile("[\t\x20-\x7e\x80-\xff]*")
_FRAMING = frozenset({"content-length", "connection", "transfer-encoding", "date"})
_EMPTY_BODY = Body(None, 0, False, Limits())  # shared: a length-0 Body never reads
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class ApplicationError(Exception):
    """The application broke the WSGI contract (PEP 3333); answered with 500."""


class FileWrapper:
    """wsgi.file_wrapper: a file the handler sends with os.sendfile() when it
    is a regular file and the socket allows it, else by reading it in blocks."""

    def __init__(self, filelike, blksize=8192):
        self.filelike = filelike
        self.blksize = blksize
        if hasattr(filelike, "close"):
            self.close = filelike.close

    def __iter__(self):
        return self

    def __next__(self):
        data = self.filelike.read(self.blksize)
        if data:
            return data
        raise StopIteration


class _BodyInput:
    """What `Body` reads from: the connection's buffered file, behind the
    100 Continue (sent before the first read) and the body timeout."""

    __slots__ = ("_handler", "continue_pending", "deadline")

    def __init__(self, handler, expect_continue):
        self._handler = handler
        self.continue_pending = expect_continue
        self.deadline = None

    def read(self, size):
        return self._handler.read_body(self, False, size)

    def readline(self, size):
        return self._handler.read_body(self, True, size)


class Handler:
    """Serves one connection: a loop of read head -> run app -> respond.

    `state` is IDLE while waiting for a request, HEAD while reading one,
    BUSY while the application runs and the response is sent.
    """

    def __init__(self, sock, address, server):
        self.socket = sock
        self.client_address = address
        self.server = server
        self.application = server.application
        self.rfile = sock.makefile("rb", READ_BUFFER)
        self.state = IDLE
        self.close_connection = False
        self.environ = None
        self.body = _EMPTY_BODY
        self.requestline = ""
        self.status = None
        self.code = None
        self.headers_sent = False
        self._input = None
        self._response_headers = ()
        self._version = "HTTP/1.1"
        self._no_body = False
        self._chunked = False
        self._cl_left = None
        self._body_sent = 0
        self._fatal = None
        self._linger = False
        self._served = 0
        self._started = 0.0
        self._throw = getcurrent().throw
        limits = server.limits
        self._head_timer = _timer(server.loop, limits.header_timeout)
        self._idle_timer = _timer(server.loop, limits.keep_alive)
        self._send_timer = _timer(server.loop, limits.send_timeout)

    # -- connection loop

    def handle(self):
        try:
            first = True
            while self._next_request(first):
                first = False
        except ClientDisconnected:
            pass
        finally:
            for timer in (self._head_timer, self._idle_timer, self._send_timer):
                if timer is not None:
                    timer.close()
            self._close()

    def _next_request(self, first):
        """Read, run and answer one request; True if the connection stays open."""
        server = self.server
        env = self._read_request(first)
        if env is None:
            return False
        self.state = BUSY
        server.active_requests += 1
        try:
            self._respond(env)
        finally:
            server.active_requests -= 1
        if server.on_request is not None:
            try:
                server.on_request()
            except Exception:
                server.logger.exception("on_request callback failed")
        if server.access_log is not None:
            self.log_access(env)
        body = self.body
        if body.error is not None:
            if isinstance(body.error, RequestError):
                self._log_refusal(body.error)
            self._linger = True
            return False
        if self.close_connection:
            self._linger = not body.done
            return False
        if not body.done and not body.finish():  # its rest is buffered (see _keep_alive)
            return False
        self._served += 1
        if not self._served % YIELD_EVERY:
            sleep(0)
        return True

    def _read_request(self, first):
        """Wait for a request and read its head; returns the environ, or None
        if the connection should close (EOF, timeout, refusal)."""
        self.state = IDLE if not first else HEAD
        rfile = self.rfile
        started = b""
        try:
            try:
                if first:
                    self._arm(self._head_timer)
                    started = rfile.peek(1)
                else:
                    self._arm(self._idle_timer)
                    started = rfile.peek(1)
                    self._disarm(self._idle_timer)
                    self._arm(self._head_timer)
                if not started:
                    return None
                self.state = HEAD
                self._started = time.perf_counter()
                return self._read_head()
            finally:
                self._disarm(self._head_timer)
                self._disarm(self._idle_timer)
        except _Expired:
            if started:  # quiet close unless part of a request arrived
                self._log_refusal(RequestError(408, "request head not received in time"))
                self._send_error(408)
            return None
        except RequestError as ex:
            self._log_refusal(ex)
            self._send_error(ex.status)
            self._linger = True
            return None
        except OSError as ex:
            if ex.errno in GONE_ERRNOS:
                return None
            raise

    def _read_head(self):
        server = self.server
        limits = server.limits
        readline = self.rfile.readline
        line_max = limits.line_max
        line = readline(line_max + 2)
        for _ in range(BLANK_LINES):
            if line != b"\r\n":
                break
            line = readline(line_max + 2)
        parsed = request_line(line, line_max)
        if parsed is None:
            return None
        method, target, version = parsed
        self.requestline = line[:-2].decode("latin-1")

        env = server.base_env.copy()
        size_max = limits.field_size_max
        content_lengths = []
        hosts = 0
        for _ in range(limits.fields_max + 1):
            line = readline(size_max)
            if line == b"\r\n":
                break
            field = header_field(line, size_max)
            if field is None:
                return None
            name, value = field
            if "_" in name:
                continue  # dropped, like gunicorn: X_Forwarded_For must not pose as X-Forwarded-For
            key = name.upper().replace("-", "_")
            if key == "CONTENT_LENGTH":
                content_lengths.append(value)
                env["CONTENT_LENGTH"] = value
                continue
            if key == "CONTENT_TYPE":
                if "CONTENT_TYPE" in env:
                    raise RequestError(400, "more than one Content-Type header")
                env["CONTENT_TYPE"] = value
                continue
            if key == "HOST":
                hosts += 1
            key = "HTTP_" + key
            if key in env:
                env[key] += ("; " if key == "HTTP_COOKIE" else ",") + value
            else:
                env[key] = value
        else:
            raise RequestError(431, f"more than {limits.fields_max} header fields")
        if hosts > 1:
            raise RequestError(400, "more than one Host header")
        if hosts and not valid_host(env["HTTP_HOST"]):
            raise RequestError(400, f"invalid Host {escape(env['HTTP_HOST'][:60])}")
        if not hosts and version == "HTTP/1.1":
            raise RequestError(400, "HTTP/1.1 request without a Host header")
        self.make_environ(env, method, target, version)

        chunked, length = body_framing(version, env.get("HTTP_TRANSFER_ENCODING"),
                                       content_lengths, limits.limit_request_body)
        connection = env.get("HTTP_CONNECTION")
        if connection is None:
            self.close_connection = version == "HTTP/1.0"
        else:
            tokens = {t.strip(" \t").lower() for t in connection.split(",")}
            self.close_connection = ("close" in tokens if version == "HTTP/1.1"
                                     else "keep-alive" not in tokens)
        if not limits.keep_alive:
            self.close_connection = True
        if chunked or length:
            expect = (version == "HTTP/1.1"
                      and env.get("HTTP_EXPECT", "").lower() == "100-continue")
            self._input = _BodyInput(self, expect)
            self.body = Body(self._input, length, chunked, limits)
        else:
            self._input = None
            self.body = _EMPTY_BODY
        env["wsgi.input"] = self.body
        self._version = version
        self._no_body = method == "HEAD"
        self.environ = env
        return env

    def make_environ(self, env, method, target, version):
        """Fill the CGI part of the WSGI environ (headers are already in `env`)."""
        path, query, authority = request_target(method, target)
        if authority is not None:  # RFC 9112 3.2.2: the target's authority wins
            env["HTTP_HOST"] = authority
        env["REQUEST_METHOD"] = method
        env["SERVER_PROTOCOL"] = version
        env["RAW_URI"] = env["REQUEST_URI"] = target
        env["PATH_INFO"] = unquote(path, "latin-1") if "%" in path else path
        env["QUERY_STRING"] = query
        address = self.client_address
        if isinstance(address, tuple):
            env["REMOTE_ADDR"] = address[0]
            env["REMOTE_PORT"] = str(address[1])

    # -- the request body

    def read_body(self, source, line, size):
        """A read for `Body`: sends 100 Continue first if the client waits for
        it, and bounds the whole body by body_timeout."""
        if source.continue_pending:
            source.continue_pending = False
            self._send(_CONTINUE)
        read = self.rfile.readline if line else self.rfile.read
        timeout = self.server.limits.body_timeout
        if not timeout:
            return read(size)
        now = time.monotonic()
        if source.deadline is None:
            source.deadline = now + timeout
        left = source.deadline - now
        if left <= 0:
            raise RequestError(408, f"request body not received within {timeout:g} s "
                                    "(--body-timeout)")
        timer = self.server.loop.timer(left)
        timer.start(self._throw, _Expired)
        try:
            return read(size)
        except _Expired:
            raise RequestError(408, f"request body not received within {timeout:g} s "
                                    "(--body-timeout)") from None
        finally:
            timer.close()

    # -- the response (PEP 3333)

    def start_response(self, status, headers, exc_info=None):
        if exc_info:
            try:
                if self.headers_sent:
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.status is not None:
            self._fatal = ApplicationError(
                "start_response() called a second time without exc_info (PEP 3333)")
            raise self._fatal
        if type(status) is not str or len(status) < 4 or status[3] != " " \
                or not status[:3].isdigit() or not status.isprintable():
            raise ApplicationError(f"invalid status {status!r}: must be a str like '200 OK'")
        if type(headers) is not list:
            raise ApplicationError(f"response headers must be a list, not {type(headers).__name__}")
        self.status = status
        self._response_headers = headers
        return self.write

    def write(self, data):
        """The WSGI write() callable; also sends each item of an iterable result."""
        if not self.headers_sent:
            self._send_head(data, None)
        elif data:
            self._send_body(data)

    def _respond(self, env):
        self.status = self.code = self._fatal = None
        self.headers_sent = self._chunked = False
        self._cl_left = None
        self._body_sent = 0
        result = None
        try:
            try:
                result = self.application(env, self.start_response)
                if self._fatal is not None:
                    raise self._fatal  # the application swallowed it
                kind = type(result)
                if (kind is list or kind is tuple) and not self.headers_sent:
                    data = result[0] if len(result) == 1 else b"".join(result)
                    self._send_head(data, len(data))
                elif kind is FileWrapper and not self.headers_sent and self._send_file(result):
                    pass
                else:
                    for data in result:
                        if data:
                            self.write(data)
                    if not self.headers_sent:
                        self._send_head(b"", 0)
                if self._chunked:
                    self._send(b"0\r\n\r\n")
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except RequestError as ex:  # from wsgi.input; logged once the response is done
            self._answer(ex.status)
        except ClientDisconnected:
            self.close_connection = True
        except (Exception, Timeout):  # a gevent.Timeout the application didn't catch
            self.server.logger.exception("error handling %s from %s",
                                         escape(self.requestline), self._peer())
            self._answer(500)
        else:
            if self._cl_left:
                self.server.logger.warning(
                    "%s: application sent %d bytes fewer than its Content-Length; closing",
                    escape(self.requestline), self._cl_left)
                self.close_connection = True

    def _send_head(self, data, total):
        """Send the response head, joined with the first body bytes `data`;
        `total` is the whole body's length if known."""
        status = self.status
        if status is None:
            raise ApplicationError("the application did not call start_response() "
                                   "before returning or writing")
        if type(data) is not bytes and not isinstance(data, (bytes, bytearray)):
            raise ApplicationError(f"response body items must be bytes, not {type(data).__name__}")
        code = int(status[:3])
        if code < 200:
            raise ApplicationError(f"status {status!r}: 1xx responses are the server's to send")
        parts = ["HTTP/1.1 ", status, "\r\n"]
        length = None
        close = False
        dated = False
        try:
            for name, value in self._response_headers:
                if not _NAME.fullmatch(name) or not _VALUE.fullmatch(value):
                    raise ApplicationError(f"invalid response header {name!r}: {value!r}")
                lname = name.lower()
                if lname in _FRAMING:
                    if lname == "content-length":
                        if length is not None or not value.isdigit() or not value.isascii():
                            raise ApplicationError(f"invalid or repeated Content-Length {value!r}")
                        length = int(value)
                        if code == 204:
                            continue
                    elif lname == "date":
                        dated = True
                    else:  # hop-by-hop: the server frames the response and owns the connection
                        close = close or (lname == "connection" and "close" in value.lower())
                        continue
                parts += (name, ": ", value, "\r\n")
        except (TypeError, ValueError) as ex:
            if isinstance(ex, ApplicationError):
                raise
            raise ApplicationError(f"response headers must be (str, str) tuples: {ex}") from ex
        no_body = self._no_body or code in (204, 304)
        if code in (204, 304):
            pass  # never a body, never framing of our own (RFC 9110 8.6, 15.4.5)
        elif length is not None:
            if not no_body:
                self._cl_left = length
        elif total is not None:
            parts += ("Content-Length: ", str(total), "\r\n")
        elif self._version == "HTTP/1.1":
            parts.append("Transfer-Encoding: chunked\r\n")
            self._chunked = not no_body
        elif not no_body:
            close = True  # HTTP/1.0: the close ends the body
        if close or not self._keep_alive():
            self.close_connection = True
            parts.append("Connection: close\r\n")
        elif self._version == "HTTP/1.0":
            parts.append("Connection: keep-alive\r\n")
        if not dated:
            parts += ("Date: ", self.server.http_date(), "\r\n")
        parts.append("\r\n")
        try:
            head = "".join(parts).encode("latin-1")
        except UnicodeEncodeError as ex:
            raise ApplicationError(f"response status or header not latin-1: {ex}") from ex
        self.code = code
        self.headers_sent = True
        if no_body or not data:
            self._send(head)
        else:
            self._send(head + self._frame(data))

    def _keep_alive(self):
        """May the connection carry another request after this response?"""
        if self.close_connection:
            return False
        body = self.body
        if not body.done:
            # Keep the connection only if the rest of the body already
            # arrived: then skipping it after the response cannot fail or
            # wait, and this head can truthfully say the connection stays.
            unread = body.unread_length
            if unread is None or unread > DISCARD_BYTES or self._input.continue_pending:
                return False
            if len(self._buffered()) < unread:
                return False
        if self.server.keep_alive_ended and not self._buffered():
            return False  # draining: unless a pipelined request waits, this is the last
        return True

    def _buffered(self):
        """What the client already sent and nobody read yet, without waiting."""
        sock = self.socket
        sock.settimeout(0.0)
        try:
            return self.rfile.peek(1)
        except OSError:
            return b""
        finally:
            sock.settimeout(None)

    def _send_body(self, data):
        if self._no_body or self.code in (204, 304):
            return
        if type(data) is not bytes and not isinstance(data, (bytes, bytearray)):
            raise ApplicationError(f"response body items must be bytes, not {type(data).__name__}")
        self._send(self._frame(data))

    def _frame(self, data):
        """Account `data` against a declared Content-Length; chunk it if chunked."""
        left = self._cl_left
        if left is not None:
            if len(data) > left:
                self.server.logger.warning(
                    "%s: application sent more than its Content-Length; truncated and closing",
                    escape(self.requestline))
                self.close_connection = True
                data = data[:left]
            self._cl_left = left - len(data)
        self._body_sent += len(data)
        if self._chunked:
            return b"%x\r\n%b\r\n" % (len(data), data)
        return data

    def _send_file(self, wrapper):
        """Send a FileWrapper's regular file with os.sendfile(); False (nothing
        sent) if it is not one, so the caller iterates it instead."""
        try:
            fileno = wrapper.filelike.fileno()
            info = os.fstat(fileno)
            offset = os.lseek(fileno, 0, os.SEEK_CUR)
        except (AttributeError, OSError, ValueError):
            return False
        if not stat.S_ISREG(info.st_mode) or not hasattr(os, "sendfile"):
            return False
        count = max(0, info.st_size - offset)
        self._send_head(b"", count)
        if self._no_body or self.code in (204, 304):
            return True
        if self._cl_left is not None:
            count = min(count, self._cl_left)
            self._cl_left -= count
        self._body_sent += count
        if self._chunked and count:
            self._send(b"%x\r\n" % count)
        self._guarded(self._sendfile, fileno, offset, count)
        if self._chunked and count:
            self._send(b"\r\n")
        return True

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
        self._guarded(self.socket.sendall, data)

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

    def _answer(self, status):
        """Send an error response if the status line hasn't gone out yet; close."""
        self.close_connection = True
        if not self.headers_sent:
            self.code = status
            self._send_error(status)

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
        """Shut the connection down; a greenlet blocked on it wakes with EBADF."""
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

    def _log_refusal(self, error):
        self.server.logger.info("refused request from %s: %d %s",
                                self._peer(), error.status, error.reason)

    def log_access(self, env):
        """One combined-format line for a request the application saw."""
        log = self.server.access_log
        if not log.isEnabledFor(logging.INFO):
            return
        now = time.localtime()
        micros = int((time.perf_counter() - self._started) * 1e6)
        log.info('%s - - [%02d/%s/%d:%02d:%02d:%02d %s] "%s" %s %s "%s" "%s" %d',
                 self._peer(), now.tm_mday, _MONTHS[now.tm_mon], now.tm_year,
                 now.tm_hour, now.tm_min, now.tm_sec, time.strftime("%z", now),
                 escape(self.requestline), self.code or "-", self._body_sent or "-",
                 escape(env.get("HTTP_REFERER", "-")), escape(env.get("HTTP_USER_AGENT", "-")),
                 micros)


def _timer(loop, seconds):
    """A loop timer for _arm(), or None for 0 seconds. Armed with again(),
    which restarts the full interval: libev's stop() keeps only the time
    *remaining*, so a timer reused with start() would count down across
    requests and expire on a busy keep-alive connection."""
    return loop.timer(seconds, seconds) if seconds else None


_MONTHS = (None, "Jan", "Feb", "Mar", "Apr", "May", "Jun",
           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
