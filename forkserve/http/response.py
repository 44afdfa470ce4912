"""The response side of PEP 3333, as pure functions: check what the
application passes to start_response(), and turn its status and headers into
an HTTP/1.1 response head framed the way the server chooses. Nothing here
does I/O or keeps state, except http_date's clock and its value of the
current second; forkserve.http.protocol frames with what these return.

Invariants:
- No header the application gives reaches the wire unless its name is an
  RFC 9110 token and its value holds only VCHAR, obs-text, SP and HTAB (no
  CR, LF or NUL: no response splitting), and status and headers are latin-1.
- The server owns the framing and the connection: the application's
  Transfer-Encoding and Connection headers are dropped (hop-by-hop, PEP 3333);
  `Connection: close` from it is honoured. Its Content-Length is kept and
  enforced by the handler; without one, a body of known length gets
  Content-Length, an HTTP/1.1 body of unknown length is chunked, and an
  HTTP/1.0 one ends with the close.
- 204 and 304 responses and responses to HEAD carry no body; 204 no
  Content-Length either (RFC 9110 8.6).
"""

import re
import time
from email.utils import formatdate
from http import HTTPStatus

from forkserve.cext import c_extension
from forkserve.http.h1 import TCHAR

__all__ = ["STATUS_CODES", "ApplicationError", "FileWrapper", "check_start_response", "build_head",
           "plan_head", "encode_head", "http_date"]

_NAME = re.compile(f"[{TCHAR}]+")
_VALUE = re.compile("[\t\x20-\x7e\x80-\xff]*")
_SPECIAL = frozenset({"content-length", "connection", "transfer-encoding", "date"})

#: Every status line of the codes Python knows (http.HTTPStatus) with its
#: standard reason phrase, and its code: such a status is valid without the
#: checks and its code known without int(). A fixed table, not a cache.
STATUS_CODES = {f"{status.value} {status.phrase}": status.value for status in HTTPStatus}

#: The response header names applications send most, as they spell them,
#: each with its lower-case form: a name found here is a token without a
#: regex match. A fixed table of names, not a cache: nothing is added to it
#: while serving, and it holds no header value.
_COMMON_NAMES = {name: name.lower() for spelling in (
    "Content-Type", "Content-Length", "Content-Encoding", "Content-Language",
    "Content-Disposition", "Content-Security-Policy", "Cache-Control", "Set-Cookie",
    "Location", "Last-Modified", "ETag", "Expires", "Vary", "Date", "Connection",
    "Transfer-Encoding", "Server", "Allow", "Retry-After", "WWW-Authenticate",
    "X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy",
    "Cross-Origin-Opener-Policy", "Strict-Transport-Security",
    "Access-Control-Allow-Origin") for name in (spelling, spelling.lower())}


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


def check_start_response(status, headers):
    """Raise ApplicationError unless `status` is a str like '200 OK' and
    `headers` a list (its items are checked when the head is built)."""
    if type(status) is not str or status not in STATUS_CODES and (
            len(status) < 4 or status[3] != " " or not status[:3].isdigit()
            or not status.isprintable()):
        raise ApplicationError(f"invalid status {status!r}: must be a str like '200 OK'")
    if type(headers) is not list:
        raise ApplicationError(f"response headers must be a list, not {type(headers).__name__}")


def plan_head(status, headers, total, version, head_request):
    """Validate the application's headers and choose the framing.

    `total` is the body's length if the server knows it (else None).
    Returns (code, lines, dated, declared, chunked, close): `lines` the head
    so far (status line and the headers kept, CRLF-terminated strs), `dated`
    whether the application gave a Date, `declared` the Content-Length the
    body must match (None: not enforced), `chunked` whether the body must be
    chunked, `close` whether the connection must close after it.
    """
    code = STATUS_CODES.get(status) or int(status[:3])
    if code < 200:
        raise ApplicationError(f"status {status!r}: 1xx responses are the server's to send")
    lines = ["HTTP/1.1 ", status, "\r\n"]
    length = None
    close = dated = False
    try:
        for name, value in headers:
            lname = _COMMON_NAMES.get(name)
            if lname is None:
                if not _NAME.fullmatch(name):
                    raise ApplicationError(f"invalid response header {name!r}: {value!r}")
                lname = name.lower()
            # printable ASCII is the usual value, checked without the regex
            if not (value.isascii() and value.isprintable() or _VALUE.fullmatch(value)):
                raise ApplicationError(f"invalid response header {name!r}: {value!r}")
            if lname in _SPECIAL:
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
            lines += (name, ": ", value, "\r\n")
    except (TypeError, ValueError, AttributeError) as ex:
        if isinstance(ex, ApplicationError):
            raise
        raise ApplicationError(f"response headers must be (str, str) tuples: {ex}") from ex
    no_body = head_request or code in (204, 304)
    declared = None
    chunked = False
    if code in (204, 304):
        pass  # never a body, never framing of our own (RFC 9110 8.6, 15.4.5)
    elif length is not None:
        declared = None if no_body else length
    elif total is not None:
        lines += ("Content-Length: ", str(total), "\r\n")
    elif version == "HTTP/1.1":
        lines.append("Transfer-Encoding: chunked\r\n")
        chunked = not no_body
    elif not no_body:
        close = True  # HTTP/1.0: the close ends the body
    return code, lines, dated, declared, chunked, close


def build_head(status, headers, total, chunk_ok, http10, head_request, keep, date):
    """Every response head the server sends, the application's and its own
    refusals: plan_head's checks and framing, the keep-alive decision and
    encode_head's bytes.

    `chunk_ok`: a body of unknown length may be chunked (an HTTP/1.1 request
    on a connection that chunks); `http10`: the request was HTTP/1.0 (which
    is told `Connection: keep-alive` when kept); `keep`: the request and the
    server let the connection stay, which the application's `Connection:
    close` or a body that only the close can end takes away; `date`: the
    Date value, unless the application gave one (None: no Date).
    Returns (code, head, declared, chunked, keep), as plan_head names them.
    forkserve/http/_h1.c's build_head is this function's fast path.
    """
    code, lines, dated, declared, chunked, close = plan_head(
        status, headers, total, "HTTP/1.1" if chunk_ok else "HTTP/1.0", head_request)
    keep = keep and not close
    head = encode_head(lines, not keep, "HTTP/1.0" if http10 else "HTTP/1.1",
                       None if dated else date)
    return code, head, declared, chunked, keep


def encode_head(lines, close, version, date):
    """Finish the head from plan_head's `lines`: the Connection header the
    keep-alive decision calls for, `date` (None if the application gave
    one), the blank line; latin-1 bytes."""
    if close:
        lines.append("Connection: close\r\n")
    elif version == "HTTP/1.0":
        lines.append("Connection: keep-alive\r\n")
    if date is not None:
        lines += ("Date: ", date, "\r\n")
    lines.append("\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError as ex:
        raise ApplicationError(f"response status or header not latin-1: {ex}") from ex


_date = [0, ""]  # the second python_http_date last formatted, and its value


def python_http_date():
    """The Date header's value for now (RFC 9110 5.6.7), formatted at most
    once a second."""
    now = int(time.time())
    if now != _date[0]:
        _date[:] = now, formatdate(now, usegmt=True)
    return _date[1]


#: http_date(): the Date header's value for now; in C (forkserve/http/_h1.c)
#: where it is built.
_H1 = c_extension("forkserve.http._h1")
http_date = python_http_date if _H1 is None else _H1.http_date
