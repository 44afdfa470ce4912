"""wsgi.input: the request body, read exactly as its framing says.

`Body` reads a Content-Length or chunked body from the file-like object it
is given (the handler's, which adds the body timeout and the 100 Continue)
with the grammar of forkserve.http.h1, and refuses anything ambiguous. It
sends nothing and keeps no time, so it is unit-tested on bytes.
"""

from forkserve.http.h1 import (CHUNK_LINE_MAX, DISCARD_BYTES, GONE_ERRNOS, ClientDisconnected,
                               RequestError, chunk_size, escape, header_field, trailer_allowed)

__all__ = ["Body"]

class Body:
    """wsgi.input: reads exactly the request body, then returns b"".

    `rfile` needs read(n) and readline(n); the handler's adds the body
    timeout and the 100 Continue. Raises RequestError (400, or 413 past
    limit_request_body for chunked bodies, or whatever `rfile` raises) or
    ClientDisconnected; the first error is kept in `error` and re-raised by
    later reads, so the handler closes the connection even if the
    application swallowed it. A body of length 0 never touches `rfile`, so
    one empty Body can serve every request without a body.
    """

    __slots__ = ("_rfile", "_left", "_chunked", "_done", "_total", "_limits", "error")

    def __init__(self, rfile, length, chunked, limits):
        self._rfile = rfile
        self._left = length or 0  # bytes left (in the current chunk if chunked)
        self._chunked = chunked
        self._done = not chunked and not length
        self._total = 0
        self._limits = limits
        self.error = None

    def read(self, size=-1):
        return self._read(size, False)

    def readline(self, size=-1):
        return self._read(size, True)

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
        line = self._read(-1, True)
        if not line:
            raise StopIteration
        return line

    def _read(self, size, line):
        if self._done:
            return b""
        if self.error is not None:
            raise self.error
        try:
            if size is None or size < 0:
                size = None
            return self._read_chunked(size, line) if self._chunked else self._read_fixed(size, line)
        except RequestError as ex:
            self.error = ex
            raise
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS and not isinstance(ex, ClientDisconnected):
                raise
            self.error = ClientDisconnected("client went away while sending the body")
            raise self.error from ex

    def _read_fixed(self, size, line):
        want = self._left if size is None else min(size, self._left)
        data = (self._rfile.readline if line else self._rfile.read)(want)
        self._left -= len(data)
        self._done = not self._left
        if len(data) < want and not (line and data.endswith(b"\n")):
            raise ClientDisconnected("client closed the connection mid-body")
        return data

    def _read_chunked(self, size, line):
        rfile, parts = self._rfile, []
        while not self._done and (size is None or size > 0):
            if not self._left:
                self._next_chunk()
                continue
            want = self._left if size is None else min(size, self._left)
            data = rfile.readline(want) if line else rfile.read(want)
            if not data or (len(data) < want and not data.endswith(b"\n")):
                raise ClientDisconnected("client closed the connection mid-chunk")
            parts.append(data)
            self._left -= len(data)
            if size is not None:
                size -= len(data)
            if not self._left and rfile.read(2) != b"\r\n":
                raise RequestError(400, "chunk data not followed by CRLF")
            if line and data.endswith(b"\n"):
                break
        return b"".join(parts)

    def _next_chunk(self):
        size = chunk_size(self._rfile.readline(CHUNK_LINE_MAX + 2))
        if size is None:
            raise ClientDisconnected("client closed the connection mid-chunk")
        if size == 0:
            self._read_trailers()
            self._done = True
            return
        self._total += size
        body_max = self._limits.limit_request_body
        if body_max and self._total > body_max:
            raise RequestError(413, f"chunked body over the {body_max}-byte limit")
        self._left = size

    def _read_trailers(self):
        limits = self._limits
        size_max = limits.field_size_max
        for _ in range(limits.fields_max + 1):
            line = self._rfile.readline(size_max)
            if line == b"\r\n":
                return
            field = header_field(line, size_max)
            if field is None:
                raise ClientDisconnected("client closed the connection in the trailers")
            if not trailer_allowed(field[0]):
                raise RequestError(400, f"{escape(field[0])} is not allowed in a trailer")
        raise RequestError(431, "too many trailer fields")

    @property
    def done(self):
        """True once the body was read to its end."""
        return self._done

    @property
    def unread_length(self):
        """Bytes of a Content-Length body not read yet; None if chunked."""
        return None if self._chunked else self._left

    @property
    def small(self):
        """True if what is left unread is small enough to skip (see finish)."""
        return self._chunked or self._left <= DISCARD_BYTES

    def finish(self):
        """Skip what the application left unread; True if the connection can
        carry another request (body consumed exactly, no error)."""
        if self.done:
            return True
        if self.error is not None or not self.small:
            return False
        skipped = 0
        try:
            while not self._done and skipped <= DISCARD_BYTES:
                skipped += len(self._read(16384, False))
        except (RequestError, ClientDisconnected):
            return False
        return self._done
