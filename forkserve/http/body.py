"""wsgi.input: the request body, as forkserve.http.protocol.Connection
decodes it (Content-Length or chunked, limits and trailers are its job).

`Body` turns the connection's Data events into read(), readline() and
iteration, and asks `fill()` for more bytes when the connection needs them
(the handler's fill reads the socket under the body timeout and sends the
100 Continue first). It does no I/O itself, so it is unit-tested on bytes.

`buffered` reads a chunked body whole before the application runs, so that
the environ can say CONTENT_LENGTH and drop Transfer-Encoding: the
application gets a body that is no longer chunked, and every framework reads
it as it reads a counted one. Gunicorn and gevent's pywsgi pass the de-chunked
stream on with `HTTP_TRANSFER_ENCODING: chunked` and no CONTENT_LENGTH: Bottle
then de-chunks it again (400), and Django, which reads CONTENT_LENGTH bytes,
sees an empty body. Waitress buffers as we do.
"""

import tempfile

from forkserve.http.h1 import ClientDisconnected, RequestError
from forkserve.http.protocol import END, NEED_DATA, PEER_CLOSED

__all__ = ["Body", "EMPTY_BODY", "buffered"]

#: A chunked body is held in memory up to this many bytes, and beyond them in
#: an unnamed temporary file (in $TMPDIR), so that a large upload costs disk
#: rather than the worker's memory (limit_request_body bounds it).
SPOOL_BYTES = 1 << 20


class Body:
    """wsgi.input: reads exactly the request body, then returns b"".

    Raises RequestError (400, 413, 431, or the 408 `fill` raises) or
    ClientDisconnected; the first error is kept in `error` and re-raised by
    later reads, so the handler answers the refusal even if the application
    swallowed it.
    """

    __slots__ = ("_connection", "_fill", "_buf", "_done", "error")

    def __init__(self, connection, fill):
        self._connection = connection
        self._fill = fill
        self._buf = b""
        self._done = False
        self.error = None

    def read(self, size=-1):
        if size is None or size < 0:
            parts = [self._buf]
            self._buf = b""
            while data := self._more(None):
                parts.append(data)
            return b"".join(parts)
        buf = self._buf
        while len(buf) < size:
            data = self._more(size - len(buf))
            if not data:
                break
            buf += data
        self._buf = buf[size:]
        return buf[:size]

    def readline(self, size=-1):
        if size is None or size < 0:
            size = None
        buf = self._buf
        while True:
            end = buf.find(b"\n", 0, size)
            if end >= 0:
                end += 1
                break
            if size is not None and len(buf) >= size:
                end = size
                break
            data = self._more(None if size is None else size - len(buf))
            if not data:
                end = len(buf)
                break
            buf += data
        self._buf = buf[end:]
        return buf[:end]

    def readlines(self, hint=-1):
        lines, total = [], 0
        for line in self:
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                break
        return lines

    def __iter__(self):
        return self

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def _more(self, max_bytes):
        """The next bytes of the body (at most `max_bytes`), b"" at its end."""
        if self._done:
            return b""
        if self.error is not None:
            raise self.error
        connection = self._connection
        try:
            while True:
                event = connection.next_event(max_bytes)
                if event is NEED_DATA:
                    self._fill()
                elif event is END:
                    self._done = True
                    return b""
                elif event is PEER_CLOSED:
                    raise ClientDisconnected("client closed the connection mid-body")
                else:
                    return event.data
        except (RequestError, ClientDisconnected) as ex:
            self.error = ex
            connection.body_failed(ex)  # which closes the connection after the response
            raise

    @property
    def done(self):
        """True once the body was read to its end."""
        return self._done


class _Empty:
    """wsgi.input of a request without a body: one shared, never reads."""

    __slots__ = ()
    error = None
    done = True

    def read(self, size=-1):
        return b""

    def readline(self, size=-1):
        return b""

    def readlines(self, hint=-1):
        return []

    def __iter__(self):
        return iter(())


EMPTY_BODY = _Empty()


def buffered(body):
    """(file, size): the whole of `body`, read now, in a file positioned at its
    start. Raises what reading raises (RequestError, ClientDisconnected)."""
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
    size = 0
    try:
        while data := body.read(65536):
            spool.write(data)
            size += len(data)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool, size
