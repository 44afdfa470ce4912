"""The HTTP/1.x wire format, strictly: the grammar of one request line,
request target, header field, chunk-size line and body framing (RFC
9110/9112), as pure functions, and of a whole head in its usual form in one
match (request_head, which declines anything else to the line parsers).
forkserve.http.protocol applies them to a connection's bytes. Nothing here
reads, sends or keeps time, so the rules are unit-tested on bytes.

Invariants:
- A request reaches the application only when its request line and every
  header field match the grammar and its body framing is unambiguous
  (Content-Length xor chunked, exactly once).
- Limits are counted as Gunicorn counts them, so the same number means the
  same limit: the request line without its CRLF (<= limit_request_line, at
  most 8190), each header line *with* its CRLF (<= limit_request_field_size),
  the number of header lines (<= limit_request_fields, at most 32768). 0 means
  what Gunicorn documents: no limit on the line or field size (a 1 MiB
  ceiling per line remains, so one connection cannot hold unbounded memory),
  32768 fields.

Decisions where the RFCs leave a choice (also in README "HTTP"):
- Leading empty lines: one CRLF before the request line is ignored (RFC 9112
  2.2 SHOULD); a second one is refused with 400, as Gunicorn does.
- Trailer fields of a chunked body are parsed with the header grammar and
  limits, then discarded (never in the environ); the framing, routing and
  authentication fields RFC 9110 6.5.1 forbids there get 400. Content-Type,
  which describes the content and frames nothing, is discarded like any
  other field, as Gunicorn does (its corpus, valid/012).
- A method is any RFC 9110 token (`-bl`, lower case included): the server
  does not know the application's methods; the application answers 405/501.
- Raw bytes outside visible ASCII in the request target get 400 (RFC 9112
  3.2 and RFC 3986 allow only ASCII; clients percent-encode).
- A fragment (`#`) in the target gets 400: clients never send one, and it
  must not leak into QUERY_STRING. CONNECT (authority-form) gets 501.
"""

import re
from dataclasses import dataclass
from functools import cached_property


__all__ = ["Limits", "RequestError", "ClientDisconnected", "escape",
           "request_head", "request_line", "request_target", "valid_host", "header_field",
           "body_framing", "chunk_size", "trailer_allowed"]

#: Gunicorn's ceilings: limit_request_line above 8190 means 8190, and
#: limit_request_fields 0 or above 32768 means 32768.
LINE_MAX = 8190
FIELDS_MAX = 32768
#: What "no limit" (0) means for the request line or one header line.
LINE_CEILING = 1 << 20

#: Longest chunk-size line (size plus extensions) accepted in a chunked body.
CHUNK_LINE_MAX = 4096

#: An unread request body of at most this many bytes, all received, is
#: skipped to keep the connection; a larger one closes it, which is cheaper
#: than reading it.
DISCARD_BYTES = 64 * 1024

#: Empty lines (CRLF) ignored before a request line (RFC 9112 section 2.2).
BLANK_LINES = 1

REASONS = {
    400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 413: "Content Too Large",
    414: "URI Too Long", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 501: "Not Implemented",
    505: "HTTP Version Not Supported",
}


@dataclass(frozen=True)
class Limits:
    """Per-request limits and connection timeouts (gunicorn's names and defaults).

    Head limits count as described at the top of this module;
    limit_request_body=0 means no limit; a timeout of 0 disables it
    (keep_alive=0 also answers every request with Connection: close).
    """

    limit_request_line: int = 4094
    limit_request_fields: int = 100
    limit_request_field_size: int = 8190
    limit_request_body: int = 0
    header_timeout: float = 10.0
    keep_alive: float = 5.0
    body_timeout: float = 30.0
    send_timeout: float = 30.0

    def __post_init__(self):
        for name, value in vars(self).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    @cached_property  # computed once: the handler reads these per request
    def line_max(self):
        """Longest request line, without its CRLF."""
        return min(self.limit_request_line, LINE_MAX) or LINE_CEILING

    @cached_property
    def field_size_max(self):
        """Longest header line, with its CRLF."""
        return min(self.limit_request_field_size or LINE_CEILING, LINE_CEILING)

    @cached_property
    def fast_head_max(self):
        """A head no longer than this has no line over its limit."""
        return min(self.line_max + 2, self.field_size_max)

    @cached_property
    def fields_max(self):
        return min(self.limit_request_fields or FIELDS_MAX, FIELDS_MAX)


class RequestError(Exception):
    """The client sent something we refuse; answer `status` and close."""

    def __init__(self, status, reason):
        super().__init__(status, reason)
        self.status = status
        self.reason = reason


class ClientDisconnected(OSError):
    """The client closed or reset the connection mid-request or mid-response."""


# --- The grammar (RFC 9110/9112), as pure functions --------------------------

TCHAR = r"!#$%&'*+\-.^_`|~0-9A-Za-z"
_TOKEN = re.compile(f"[{TCHAR}]+")
# Request target: visible ASCII only (RFC 9112 3.2, RFC 3986).
_REQUEST_LINE = re.compile(f"([{TCHAR}]+) ([\x21-\x7e]+) HTTP/([0-9])\\.([0-9])\r\n")
_TARGET = re.compile("[\x21-\x7e]+")
# Field value: VCHAR, obs-text, SP and HTAB; OWS is stripped afterwards.
_FIELD = re.compile(f"([{TCHAR}]+):([\t\x20-\x7e\x80-\xff]*)\r\n")
_ABSOLUTE = re.compile(r"(https?)://([^/?]*)(.*)", re.IGNORECASE | re.DOTALL)
# Host (RFC 9110 7.2 / RFC 3986 3.2.2): IP-literal or reg-name, optional port.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|\[[vV][0-9A-Fa-f]+\.[\w.~!$&'()*+,;=:-]+\]"
                   r"|[\w.~%!$&'()*+,;=-]*)(?::[0-9]*)?", re.ASCII)
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_BTOKEN = f"[{TCHAR}]+".encode()
_CHUNK_LINE = re.compile(
    rb"([0-9A-Fa-f]{1,16})"
    rb"(?:[ \t]*;[ \t]*" + _BTOKEN + rb"(?:[ \t]*=[ \t]*(?:" + _BTOKEN + rb"|" + _QUOTED + rb"))?)*"
    rb"\r\n")
_DIGITS = re.compile("[0-9]{1,18}")
# A whole head in its usual form, in one match (request_head): the request
# line of an HTTP/1.x request, then field lines, every line ending in CRLF.
_HEAD = re.compile(f"(([{TCHAR}]+) ([\x21-\x7e]+) HTTP/1\\.([0-9]))\r\n"
                   f"(?:[{TCHAR}]+:[\t\x20-\x7e\x80-\xff]*\r\n)*")
# One field line of a head _HEAD matched: the name, and the value without the
# OWS around it (from its first to its last visible byte). Single-character
# repeats only: a repeated group costs the regex engine per iteration, and
# an 8 KiB value of "a " pairs took 0.7 ms that way.
_HEAD_FIELD = re.compile(f"([{TCHAR}]+):[\t ]*((?:[\x21-\x7e\x80-\xff]"
                         f"(?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?)[\t ]*\r\n")

#: Fields a chunked body's trailer section may not carry (RFC 9110 6.5.1:
#: framing, routing, request modifiers, authentication, payload processing).
#: Content-Type is not among them: it changes no framing, and RFC 9110 6.5.1
#: lets a recipient discard it, as every trailer field is discarded here.
FORBIDDEN_TRAILERS = frozenset({
    "content-length", "transfer-encoding", "host", "content-encoding",
    "content-range", "trailer", "te", "connection", "keep-alive", "upgrade", "expect",
    "range", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since",
    "if-range", "max-forwards", "cache-control", "pragma", "authorization",
    "proxy-authorization", "cookie", "set-cookie", "www-authenticate", "proxy-authenticate",
})


def request_head(text):
    """Parse a whole request head in one step, the usual case.

    `text` is the head as latin-1 text, from the request line to the CRLF of
    its last field line (the blank line that ends it left out), with no line
    over its limit. Returns (method, target, version, line, fields): `line`
    the request line without its CRLF, `fields` the (name, value) pairs in
    order, each as header_field() gives it. Returns None if any line is not
    in the form request_line() and header_field() accept, or the version is
    not HTTP/1.x: then parse it line by line with those two, which say what
    is wrong.
    """
    match = _HEAD.fullmatch(text)
    if match is None:
        return None
    line, method, target, minor = match.groups()
    return (method, target, "HTTP/1.0" if minor == "0" else "HTTP/1.1", line,
            _HEAD_FIELD.findall(text, match.end(1) + 2))


def request_line(line, line_max):
    """Parse a request line read with readline(line_max + 2).

    Returns (method, target, version, text), `text` the line as received
    without its CRLF (the access log's), or None if the client closed the
    connection mid-line; raises RequestError for anything else invalid.
    """
    text = line.decode("latin-1")
    match = _REQUEST_LINE.fullmatch(text)
    if match is not None and len(line) <= line_max + 2:
        method, target, major, minor = match.groups()
        if major != "1":
            raise RequestError(505, f"unsupported version HTTP/{major}.{minor}")
        # RFC 9110 6.2: a higher minor version is processed as the highest we know.
        return method, target, "HTTP/1.0" if minor == "0" else "HTTP/1.1", text[:-2]
    if len(line) > line_max + 2 or (len(line) == line_max + 2 and not text.endswith("\n")):
        raise RequestError(414, f"request line longer than {line_max} bytes")
    if not text.endswith("\n"):
        return None
    if not text.endswith("\r\n"):
        raise RequestError(400, "request line not terminated by CRLF")
    words = text[:-2].split(" ")
    if len(words) != 3:
        raise RequestError(400, "request line is not 'METHOD target HTTP/1.x'")
    method, target, version = words
    if not _TOKEN.fullmatch(method):
        raise RequestError(400, f"invalid method {escape(method[:40])}")
    if not _TARGET.fullmatch(target):
        raise RequestError(400, "request target has a byte outside visible ASCII "
                                "(percent-encode it)")
    raise RequestError(400, f"invalid HTTP version {escape(version[:20])}")


def request_target(method, target):
    """Split a request target (RFC 9112 3.2): returns (path, query, authority).

    `authority` is the host of an absolute-form target (which RFC 9112 3.2.2
    says replaces any Host header), else None. OPTIONS * gives path "*".
    """
    if "#" in target:
        raise RequestError(400, "fragment (#) in the request target")
    if method == "CONNECT":
        raise RequestError(501, "CONNECT is not supported (this is not a proxy)")
    authority = None
    if target[0] != "/":
        if target == "*":
            if method != "OPTIONS":
                raise RequestError(400, f"asterisk-form target with {escape(method)}, not OPTIONS")
            return "*", "", None
        match = _ABSOLUTE.fullmatch(target)
        if match is None:
            raise RequestError(400, "request target must be a path, an absolute http(s) URL "
                                    "or * (OPTIONS)")
        _, authority, target = match.groups()
        if not authority or "@" in authority or not _HOST.fullmatch(authority):
            raise RequestError(400, f"invalid authority {escape(authority[:60])} in the target")
        if not target or target[0] == "?":
            target = "/" + target
    path, _, query = target.partition("?")
    return path, query, authority


def valid_host(value):
    """True if `value` is a valid Host field value (RFC 9110 7.2)."""
    return _HOST.fullmatch(value) is not None


def header_field(line, size_max):
    """Parse one header (or trailer) line read with readline(size_max);
    `size_max` counts the CRLF. Returns (name, value), or None if the client
    closed mid-line.
    """
    text = line.decode("latin-1")
    match = _FIELD.fullmatch(text)
    if match is not None:
        return match.group(1), match.group(2).strip(" \t")
    if not text.endswith("\n"):
        if len(line) >= size_max:
            raise RequestError(431, f"header field longer than {size_max} bytes (CRLF included)")
        return None
    if not text.endswith("\r\n"):
        raise RequestError(400, "header line not terminated by CRLF")
    if text[0] in " \t":
        raise RequestError(400, "obsolete line folding in header")
    name, colon, value = text[:-2].partition(":")
    if not colon:
        raise RequestError(400, "header line without a colon")
    if name != name.rstrip(" \t"):
        raise RequestError(400, "whitespace between header name and colon")
    if not _TOKEN.fullmatch(name):
        raise RequestError(400, f"invalid header name {escape(name[:40])}")
    raise RequestError(400, f"control character in header {escape(name)}")


def trailer_allowed(name):
    """False for a field RFC 9110 6.5.1 forbids in a trailer section."""
    return name.lower() not in FORBIDDEN_TRAILERS


def body_framing(version, transfer_encoding, content_lengths, body_max):
    """Decide how the request body is framed: returns (chunked, length).

    `transfer_encoding` is the comma-joined value of every Transfer-Encoding
    line (or None), `content_lengths` the list of Content-Length values.
    Unsupported codings before a final "chunked" get 501; everything else
    ambiguous gets 400, as RFC 9112 section 6 asks of a server.
    """
    if transfer_encoding is not None:
        if content_lengths:
            raise RequestError(400, "both Content-Length and Transfer-Encoding")
        if version == "HTTP/1.0":
            raise RequestError(400, "Transfer-Encoding in an HTTP/1.0 request")
        codings = [c.strip(" \t").lower() for c in transfer_encoding.split(",")]
        if not all(_TOKEN.fullmatch(c) for c in codings) or codings[-1] != "chunked":
            raise RequestError(400, f"Transfer-Encoding {escape(transfer_encoding[:60])}"
                                    " does not end in chunked")
        if codings.count("chunked") > 1:
            raise RequestError(400, "chunked applied more than once")
        if len(codings) > 1:
            raise RequestError(501, f"unsupported Transfer-Encoding {escape(transfer_encoding[:60])}")
        return True, None
    if not content_lengths:
        return False, 0
    if len(content_lengths) > 1:
        raise RequestError(400, "more than one Content-Length")
    if not _DIGITS.fullmatch(content_lengths[0]):
        raise RequestError(400, f"invalid Content-Length {escape(content_lengths[0][:30])}")
    length = int(content_lengths[0])
    if body_max and length > body_max:
        raise RequestError(413, f"Content-Length {length} over the {body_max}-byte limit")
    return False, length


def chunk_size(line):
    """Parse a chunk-size line (extensions are checked and ignored).

    Returns the size, or None if the client closed mid-line.
    """
    match = _CHUNK_LINE.fullmatch(line)
    if match is not None:
        return int(match.group(1), 16)
    if not line.endswith(b"\n") and len(line) < CHUNK_LINE_MAX + 2:
        return None
    raise RequestError(400, "invalid chunk-size line")


_LOG_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x22, 0x5C, 0x7F)}


def escape(text):
    """Make client-supplied text safe for a log line: only printable ASCII
    remains, and quotes, backslashes and everything else become \\xNN escapes."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return text.translate(_LOG_ESCAPES).encode("ascii", "backslashreplace").decode("ascii")
