"""One uwsgi-protocol connection without I/O: what nginx's `uwsgi_pass`
(with `include uwsgi_params`) sends, turned into the same events as an
HTTP/1.1 connection (forkserve.http.protocol), so the handler, wsgi.input,
the responder and request_environ serve both unchanged.

The request: a 4-byte header (modifier1 u8, datasize u16 little-endian,
modifier2 u8), then `datasize` bytes of vars, each a u16 LE key length, the
key, a u16 LE value length, the value; then the request body, CONTENT_LENGTH
bytes of it. The response is an HTTP/1.x response head and body, as nginx's
uwsgi module parses it.

Invariants, and why:
- One request per connection, as uWSGI serves it and nginx uses it: nginx's
  uwsgi module never returns an upstream connection to its keep-alive pool
  (`keepalive` in an upstream block reuses HTTP and FastCGI connections
  only; `uwsgi_socket_keepalive` is TCP keep-alive probes). So every
  response says `Connection: close` and the connection closes after it;
  nothing after the request body is ever parsed, so no request can be
  smuggled behind a body whose length lies.
- The body's length is CONTENT_LENGTH's, checked as the HTTP side checks
  Content-Length (digits only, limit_request_body; 413 over it). Absent or
  empty means no body. nginx buffers a chunked client body before passing it
  to a uwsgi upstream (even with `uwsgi_request_buffering off`) and sends
  its real length, so there is never a chunked body here; a
  Transfer-Encoding var is the client's header, dropped from the environ.
- A packet is refused (400, or the HTTP side's 414/431/413 for its limits)
  and the connection closed unless: modifier1 is 0 (a WSGI request) or 30
  (the same, SCRIPT_NAME stripped) and modifier2 is 0, the vars fill the datasize exactly, every key is a CGI-style
  name, no value holds CR, LF or NUL, REQUEST_METHOD is a token, the request
  URI fits limit_request_line, each var (its name too) fits
  limit_request_field_size as the header line it would be, there are at
  most limit_request_fields header vars, and HTTP_HOST (once)
  is a valid Host. The datasize field bounds a packet at 64 KiB.
- The environ is request_environ's, from a protocol.Request built of the
  vars: header vars keyed as the HTTP side keys them (repeats joined with
  "," and Cookie with "; "), PATH_INFO as nginx sent it (already decoded,
  after its rewrites), and the vars that are not headers (REMOTE_ADDR,
  SERVER_NAME, HTTPS, DOCUMENT_ROOT...) as given: the uwsgi peer is trusted
  like uWSGI trusts it. wsgi.url_scheme comes from UWSGI_SCHEME, else HTTPS.
- No 100 Continue is ever sent: nginx answers the client's Expect itself,
  and would read a 100 as the final response.
"""

import re
import struct

from forkserve.http.h1 import RequestError, body_framing, escape, request_target, valid_host
from forkserve.http.protocol import (BODY, CLOSED, DONE, HEAD, NEED_DATA, PEER_CLOSED,
                                     Connection, Request)

__all__ = ["UwsgiConnection", "parse_vars", "encode_packet", "PACKET_HEADER"]

PACKET_HEADER = 4
#: modifier1 values of a WSGI request: 0, and 30, which old nginx sites send
#: (uwsgi_modifier1 30) to have SCRIPT_NAME stripped from PATH_INFO, as
#: forkserve always does
WSGI_MODIFIERS = (0, 30)
_HEADER = struct.Struct("<BHB")
_LENGTH = struct.Struct("<H")
_KEY = re.compile(r"[A-Za-z0-9_.\-]+")
_VERSION = re.compile(r"HTTP/[0-9](?:\.[0-9])?")
_METHOD = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile("[\r\n\x00]")
#: the vars request_environ sets from the Request itself
_REQUEST_KEYS = frozenset({"REQUEST_METHOD", "SERVER_PROTOCOL", "REQUEST_URI", "PATH_INFO",
                           "QUERY_STRING", "CONTENT_LENGTH"})
#: client headers nginx also passes as vars, which the HTTP side never puts in
#: an environ: CONTENT_TYPE/CONTENT_LENGTH are the framing's, Transfer-Encoding
#: was undone by nginx
_DROPPED = frozenset({"HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH", "HTTP_TRANSFER_ENCODING"})


def parse_vars(data):
    """The (key, value) pairs of a packet's vars, as latin-1 strs, in order.
    Raises RequestError(400) unless they fill `data` exactly."""
    # one decode for the packet: latin-1 maps each byte to one character, so
    # the text's offsets are the bytes' (a decode per key and value and a
    # struct call per length were 4 C calls a var, ~80 a request from nginx)
    text = data.decode("latin-1")
    pairs = []
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < 2:
            raise RequestError(400, "uwsgi packet: a var's key length runs past the datasize")
        size = data[pos] | data[pos + 1] << 8  # u16 little-endian
        pos += 2
        if not size or end - pos < size + 2:
            raise RequestError(400, "uwsgi packet: an empty key, or a key running past the "
                                    "datasize")
        key = text[pos:pos + size]
        pos += size
        size = data[pos] | data[pos + 1] << 8
        pos += 2
        if end - pos < size:
            raise RequestError(400, f"uwsgi packet: the value of {escape(key[:40])} runs past "
                                    "the datasize")
        pairs.append((key, text[pos:pos + size]))
        pos += size
    return pairs


def encode_packet(pairs, modifier1=0, modifier2=0):
    """A uwsgi request packet of (key, value) str pairs (latin-1), as nginx
    sends it: for tests, benchmarks and the docs' examples."""
    body = b"".join(_LENGTH.pack(len(k)) + k + _LENGTH.pack(len(v)) + v
                    for k, v in ((k.encode("latin-1"), v.encode("latin-1")) for k, v in pairs))
    return _HEADER.pack(modifier1, len(body), modifier2) + body


class UwsgiConnection(Connection):
    """The server side of one uwsgi connection: protocol.Connection's events
    and response framing, with the request head read from a uwsgi packet
    (see the module's invariants). Responses of unknown length end with the
    close, never chunked: nginx's uwsgi module does not decode chunks.

    It replaces Connection._next_head, the one step that differs, and sets
    the state that step sets in Connection (their_state, the Content-Length
    body's _left, _continue, _no_body); the body's framing, the response
    side and every state after the head are Connection's own code."""

    chunk_responses = False

    def __init__(self, limits, environ_base=None):
        # its environ is request_environ's: no base for the parser; Connection.__init__, not
        # super(): tests run this class's code on the Python base too (test_h1_accel.py)
        Connection.__init__(self, limits)
        self._c_parse = False  # its head is a packet: next_event is all _next_event's
        self._keep_alive_allowed = False
        self.keep_alive = False

    def _next_head(self):
        buf, pos = self._buf, self._pos
        available = len(buf) - pos
        if not available:
            if self._eof:
                self.their_state = CLOSED
                return PEER_CLOSED
            return NEED_DATA
        self.their_state = HEAD
        if available >= PACKET_HEADER:
            modifier1, size, modifier2 = _HEADER.unpack_from(buf, pos)
            if modifier1 not in WSGI_MODIFIERS or modifier2:
                raise RequestError(400, _not_wsgi(buf[pos:pos + PACKET_HEADER], modifier1,
                                                  modifier2))
            if available >= PACKET_HEADER + size:
                self._pos = pos + PACKET_HEADER + size
                return self._packet_done(parse_vars(buf[pos + PACKET_HEADER:self._pos]))
        if self._eof:
            self.their_state = CLOSED
            return PEER_CLOSED
        return NEED_DATA

    def _packet_done(self, pairs):
        limits = self.limits
        field_max, fields_max = limits.field_size_max, limits.fields_max
        headers, request_vars, lengths = {}, {}, []
        fields = 0
        for key, value in pairs:
            if not _KEY.fullmatch(key):
                raise RequestError(400, f"uwsgi var name {escape(key[:40])} is not a CGI name")
            if _BAD_VALUE.search(value):
                raise RequestError(400, f"uwsgi var {escape(key[:40])} holds CR, LF or NUL")
            # every var but the request's own as the header line "Name: value\r\n"
            # counts on the HTTP side (a header's name without HTTP_): a long name
            # is refused there too
            header = key.startswith("HTTP_")
            if len(key) + len(value) + (-1 if header else 4) > field_max \
                    and key not in _REQUEST_KEYS:
                raise RequestError(431, f"uwsgi var {escape(key[:40])} over {field_max} bytes")
            if header:
                fields += 1
                if fields > fields_max:
                    raise RequestError(431, f"more than {fields_max} header fields")
                if key in _DROPPED:
                    continue
                if key in headers:
                    if key == "HTTP_HOST":
                        raise RequestError(400, "more than one Host header")
                    headers[key] += ("; " if key == "HTTP_COOKIE" else ",") + value
                else:
                    headers[key] = value
            elif key in _REQUEST_KEYS:
                if key == "CONTENT_LENGTH":
                    if value:
                        lengths.append(value)
                else:
                    request_vars[key] = value
            else:
                headers[key] = value  # the last of a repeated var wins, as in uWSGI
        return self._request(headers, request_vars, lengths)

    def _request(self, headers, request_vars, lengths):
        limits = self.limits
        method = request_vars.get("REQUEST_METHOD", "")
        if not _METHOD.fullmatch(method):
            raise RequestError(400, f"invalid or missing REQUEST_METHOD {escape(method[:40])}")
        version = request_vars.get("SERVER_PROTOCOL") or "HTTP/1.0"
        if not _VERSION.fullmatch(version):
            raise RequestError(400, f"invalid SERVER_PROTOCOL {escape(version[:20])}")
        path = request_vars.get("PATH_INFO")
        query = request_vars.get("QUERY_STRING", "")
        target = request_vars.get("REQUEST_URI")
        if target is None:
            if path is None:
                raise RequestError(400, "uwsgi packet has neither REQUEST_URI nor PATH_INFO")
            target = path + ("?" + query if query else "")
        if len(target) > limits.line_max:
            raise RequestError(414, f"request URI longer than {limits.line_max} bytes")
        host = headers.get("HTTP_HOST")
        decoded = path is not None  # nginx's PATH_INFO: decoded, after its rewrites
        if not decoded:  # only the URI: split (and later decode) it as the HTTP side does
            path, query, _ = request_target(method, target)
        if host is not None and not valid_host(host):
            raise RequestError(400, f"invalid Host {escape(host[:60])}")
        scheme = headers.get("UWSGI_SCHEME")
        if scheme is None:
            https = headers.get("HTTPS", "").lower()
            scheme = "https" if https in ("on", "1") else None
        elif scheme not in ("http", "https"):
            raise RequestError(400, f"invalid UWSGI_SCHEME {escape(scheme[:20])}")
        if scheme is not None:
            headers["wsgi.url_scheme"] = scheme
        chunked, length = body_framing(version, None, lengths, limits.limit_request_body)
        if lengths:  # "0" too, as the HTTP side keeps a Content-Length: 0
            headers["CONTENT_LENGTH"] = lengths[0]
        if length:
            self.their_state, self._left = BODY, length
        else:
            self.their_state = DONE
        self._chunk_state = None
        self._continue = False  # nginx answered Expect: 100-continue itself
        self._body_total = 0
        self._no_body = method == "HEAD"
        self.keep_alive = False
        self.request = request = Request(method, target, version, f"{method} {target} {version}",
                                         headers, path, query, None, decoded)
        request.chunked = chunked
        request.length = length
        return request


def _not_wsgi(header, modifier1, modifier2):
    if 0x41 <= header[0] <= 0x5A:  # an upper-case letter: a method, as in "GET / HTTP/1.1"
        return ("this listener speaks the uwsgi protocol, and the request looks like HTTP: "
                "point nginx's uwsgi_pass here, or send HTTP to a listener bound without uwsgi:")
    return (f"uwsgi packet with modifier1 {modifier1}, modifier2 {modifier2}: forkserve serves "
            "WSGI requests (modifier1 0 or 30, modifier2 0) only; remove uwsgi_modifier1/"
            "uwsgi_modifier2 from nginx")
