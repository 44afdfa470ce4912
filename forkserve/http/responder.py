"""The response side of a connection (PEP 3333): start_response, write(),
running the application and sending what it returns.

A `Responder` is the half of forkserve.http.handler.Handler that answers
one request: it frames the body (Content-Length kept and enforced, or
chunked), sends the head joined with the first body bytes when the
application returns a list (one send per response), sends files with
os.sendfile(), and decides once, when the head is built, whether the
connection stays open, so every response before a close says
`Connection: close`. Once reading the request body failed (timeout, bad
chunk, too large), the response is the server's refusal (408, 400, 413),
whatever the application answers after catching the error. The pure rules (start_response's checks, the head's
lines) are in forkserve.http.response.
"""

import os
import stat

from gevent import Timeout

from forkserve.http.connection import Connection
from forkserve.http.h1 import DISCARD_BYTES, ClientDisconnected, RequestError, escape
from forkserve.http.response import (ApplicationError, check_start_response, encode_head,
                                     FileWrapper, plan_head)

__all__ = ["Responder"]


class Responder(Connection):
    """Runs the application for a request and sends its response.

    The request side (forkserve.http.handler.Handler) sets `environ`, `body`,
    `_input`, `_version`, `_no_body`, `requestline` and `close_connection`
    before it calls `_respond(env)`.
    """

    def __init__(self, sock, address, server):
        super().__init__(sock, address, server)
        self.status = None
        self.code = None
        self.headers_sent = False
        self._response_headers = ()
        self._version = "HTTP/1.1"
        self._no_body = False
        self._chunked = False
        self._cl_left = None
        self._body_sent = 0
        self._fatal = None

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
        check_start_response(status, headers)
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
                if (kind is list or kind is tuple or isinstance(result, list)) \
                        and not self.headers_sent:
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
            if self.body.error is not None:  # raised because reading the body failed:
                self._answer_body_error()   # the refusal is logged, not this traceback
                return
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
        if self.body.error is not None:
            raise self.body.error  # whatever the application answers, the refusal goes out
        status = self.status
        if status is None:
            raise ApplicationError("the application did not call start_response() "
                                   "before returning or writing")
        if type(data) is not bytes and not isinstance(data, (bytes, bytearray)):
            raise ApplicationError(f"response body items must be bytes, not {type(data).__name__}")
        code, lines, dated, self._cl_left, self._chunked, close = plan_head(
            status, self._response_headers, total, self._version, self._no_body)
        if close or not self._keep_alive():
            self.close_connection = close = True
        head = encode_head(lines, close, self._version, None if dated else self.server.http_date())
        self.code = code
        self.headers_sent = True
        if self._no_body or code in (204, 304) or not data:
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
        sent) if it is not one or the sendfile setting is off, so the caller
        iterates it instead."""
        if not self.server.sendfile:
            return False
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

    def _answer_body_error(self):
        """Reading the body failed: answer the refusal's status (a client that
        went away gets nothing) and close."""
        error = self.body.error
        if isinstance(error, RequestError):
            self._answer(error.status)
        else:
            self.close_connection = True

    def _answer(self, status):
        """Send an error response if the status line hasn't gone out yet; close."""
        self.close_connection = True
        if not self.headers_sent:
            self.code = status
            self._send_error(status)
