"""The WSGI response of one request (PEP 3333): start_response, write(),
running the application and sending what it returns.

A `Responder` serves the requests of one connection, one at a time, for
forkserve.http.handler.Handler, which owns it. It sends through the
connection's `Transport` what the connection object
(forkserve.http.protocol.Connection) frames: the head joined with the body
when the application returns a list (one send per response), or with the
first chunk of an iterator; files with os.sendfile() (unless the sendfile
setting is off). Once reading the request body failed (timeout, bad chunk,
too large: the connection's `body_error`), the response is the server's
refusal (408, 400, 413), whatever the application answers after catching
the error. What the connection needs to know before it decides keep-alive
(`wants_peek`: a pipelined request while draining, the rest of a small
body) is read for it without waiting, and fed to it, before the head.
"""

import os
import stat

from gevent import Timeout

from forkserve.http.h1 import ClientDisconnected, RequestError, escape
from forkserve.http.response import (STATUS_CODES, ApplicationError, FileWrapper,
                                     check_start_response, http_date)

__all__ = ["Responder"]


class Responder:
    """Runs the application for a request and sends its response.

    After respond(): `code` is the status sent (None if nothing was),
    `headers` the application's headers if its head went out (else ()).
    """

    def __init__(self, http, transport, server, peer):
        self.http = http
        self.transport = transport
        self.server = server
        self.peer = peer
        self.status = None
        self.code = None
        self.headers = ()
        self.headers_sent = False
        self._fatal = None
        # bound once: the application gets the same callables on every
        # request (a cycle through self, broken by close())
        self._start_response = self.start_response
        self._write = self.write

    def close(self):
        """The connection has ended: drop the bound methods that refer back to
        this responder, so it (and its transport) is freed without a
        collection."""
        self._start_response = self._write = None

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
        if type(status) is not str or status not in STATUS_CODES or type(headers) is not list:
            # else valid as it is
            check_start_response(status, headers)
        self.status = status
        self.headers = headers
        return self._write

    def write(self, data):
        """The WSGI write() callable; also sends each item of an iterable result."""
        if not self.headers_sent:
            self._send_head(data, None)
        elif data:
            if type(data) is not bytes and not isinstance(data, (bytes, bytearray)):
                raise ApplicationError(
                    f"response body items must be bytes, not {type(data).__name__}")
            self.transport.send(self.http.response_data(data))

    def respond(self, env, line):
        """Run the application on `env` and send its response; `line` is the
        request line, for the log."""
        self.status = self.code = self._fatal = self._total = None
        self.headers = ()
        self.headers_sent = False
        self.transport.line = line  # for a held response, and a cut one's log line
        http = self.http
        result = None
        try:
            try:
                result = self.server.application(env, self._start_response)
                if self._fatal is not None:
                    raise self._fatal  # the application swallowed it
                kind = type(result)
                if (kind is list or kind is tuple or isinstance(result, list)) \
                        and not self.headers_sent:
                    data = result[0] if len(result) == 1 else b"".join(result)
                    # the usual response is built and ended in one step
                    whole = http.whole_response(self.status, self.headers, data, http_date()) \
                        if type(data) is bytes and self.status is not None \
                        and http.body_error is None else None
                    if whole is not None:
                        self.code = http.code
                        self.headers_sent = True
                        self._total = len(data)
                        self.transport.send_response(whole)
                    else:
                        self._send_whole(data)
                else:
                    if not (kind is FileWrapper and not self.headers_sent
                            and self._send_file(result)):
                        for data in result:
                            if data:
                                self.write(data)
                        if not self.headers_sent:
                            self._send_head(b"", 0)
                    end = http.response_end()
                    if end:
                        self.transport.send(end)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except RequestError as ex:  # from wsgi.input; logged once the response is done
            self._answer(ex.status)
        except ClientDisconnected as ex:
            http.response_cut()
            unsent = getattr(ex, "unsent", None)
            if unsent is not None:  # else an earlier response's: the transport has it
                self.server.cuts.report(self.peer, line, max(0, http.sent - unsent),
                                        self._body_total(), str(ex))
        except (Exception, Timeout):  # a gevent.Timeout the application didn't catch
            if http.body_error is not None:  # raised because reading the body failed:
                self._answer_body_error()   # the refusal is logged, not this traceback
                return
            self.server.logger.exception("error handling %s from %s", escape(line), self.peer)
            self._answer(500)
        else:
            if http.response_problem is not None:
                self.server.logger.warning("%s: %s", escape(line), http.response_problem)

    def _send_whole(self, data):
        """Send the response whose body is all of `data`, and end it, where
        the connection's whole_response leaves the steps to the driver:
        head, checks and end one by one."""
        self._send_head(data, len(data))
        end = self.http.response_end()
        if end:
            self.transport.send(end)

    def _send_head(self, data, total):
        """Send the response head, joined with the first body bytes `data`;
        `total` is the whole body's length if known."""
        http = self.http
        if http.body_error is not None:
            raise http.body_error  # whatever the application answers, the refusal goes out
        status = self.status
        if status is None:
            raise ApplicationError("the application did not call start_response() "
                                   "before returning or writing")
        if type(data) is not bytes and not isinstance(data, (bytes, bytearray)):
            raise ApplicationError(f"response body items must be bytes, not {type(data).__name__}")
        if http.wants_peek():
            arrived = self.transport.read_now()
            if arrived is not None:  # b"" is the client's close; None, nothing yet
                http.receive_data(arrived)
        head = http.response_head(status, self.headers, data, total, http_date())
        self._total = total
        self.code = http.code
        self.headers_sent = True
        self.transport.send(head)

    def _body_total(self):
        """The length of the body being sent, if known: given to the head, or
        the application's Content-Length."""
        if self._total is not None:
            return self._total
        for name, value in self.headers:
            if name.lower() == "content-length" and value.strip().isdigit():
                return int(value)
        return None

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
        prefix, count, suffix = self.http.response_file(count)
        transport = self.transport
        if prefix:
            transport.send(prefix)
        if count:
            transport.sendfile(fileno, offset, count)
        if suffix:
            transport.send(suffix)
        return True

    def _answer_body_error(self):
        """Reading the body failed: answer the refusal's status (a client that
        went away gets nothing) and close."""
        error = self.http.body_error
        if isinstance(error, RequestError):
            self._answer(error.status)
        else:
            self.http.response_cut()

    def _answer(self, status):
        """Send an error response if the status line hasn't gone out yet; close."""
        if self.headers_sent:
            self.http.response_cut()
            return
        self.code = status
        try:
            self.transport.send(self.http.refusal(status))
        except ClientDisconnected:
            pass
