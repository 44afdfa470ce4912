"""What a trusted proxy in front may tell forkserve: the scheme and the client.

Gunicorn's rules, which users behind nginx, HAProxy or a load balancer
already configure:

- secure_scheme_headers (default X-FORWARDED-PROTOCOL: ssl,
  X-FORWARDED-PROTO: https, X-FORWARDED-SSL: on) set wsgi.url_scheme, but
  only from peers in forwarded_allow_ips (default 127.0.0.1 and ::1; '*'
  for any; CIDR networks). Unix-socket peers are always trusted. Each listed
  header present says https if its value matches exactly, http otherwise;
  two that disagree are a 400 (a client may be trying to pass one off).
- PROXY protocol v1 (text) or v2 (binary), as HAProxy and AWS load
  balancers send it before the first request of a connection (--proxy-protocol
  v1, v2 or auto), sets REMOTE_ADDR and REMOTE_PORT to the client's. It is
  accepted only from peers in proxy_allow_ips (403 otherwise); a connection
  that does not start with a PROXY header is served as plain HTTP.

The parsers are pure functions of bytes; `ProxyPolicy.read_header` is the
only part that reads, from the connection's buffered reader.
"""

import ipaddress
import socket
import struct

from forkserve.http.h1 import RequestError

__all__ = ["ProxyPolicy", "ProxyInfo", "AddressList", "parse_v1", "parse_v2", "V2_SIGNATURE",
           "scheme_from_headers"]

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
_V1_MAX = 107  # the longest v1 line, CRLF included (the spec's figure)


class ProxyInfo:
    """The client a PROXY header names (None for LOCAL/UNSPEC: keep the peer)."""
    __slots__ = ("client_addr", "client_port")

    def __init__(self, client_addr=None, client_port=None):
        self.client_addr = client_addr
        self.client_port = client_port


#: Peer addresses whose answer an AddressList remembers (then no more are added).
KNOWN_MAX = 4096


class AddressList:
    """A forwarded_allow_ips / proxy_allow_ips list: addresses, networks or '*'."""

    def __init__(self, items):
        items = [item.strip() for item in items if item.strip()]
        self.everyone = "*" in items
        self.networks = [ipaddress.ip_network(item, strict=False)
                         for item in items if item != "*"]
        self._known = {}  # host -> in the list; a connection's peer asks per request

    def __contains__(self, peer):
        if not isinstance(peer, tuple):
            return True  # a unix socket: only local processes can connect
        if self.everyone:
            return True
        host = peer[0]
        known = self._known.get(host)
        if known is None:
            known = self._match(host)
            if len(self._known) < KNOWN_MAX:
                self._known[host] = known
        return known

    def _match(self, host):
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)


def scheme_from_headers(environ, secure_headers):
    """"https" or "http" from the secure scheme headers present, or None if
    none is. Raises RequestError(400) when they contradict each other."""
    scheme = None
    for name, secure_value in secure_headers:
        value = environ.get(name)
        if value is None:
            continue
        said = "https" if value == secure_value else "http"
        if scheme is not None and said != scheme:
            raise RequestError(400, "contradictory scheme headers")
        scheme = said
    return scheme


def parse_v1(line: bytes) -> ProxyInfo:
    """A v1 header line (CRLF stripped). Raises RequestError(400) if invalid."""
    try:
        words = line.decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise RequestError(400, "invalid PROXY line") from None
    if len(words) == 2 and words[1] == "UNKNOWN" or words[:2] == ["PROXY", "UNKNOWN"]:
        return ProxyInfo()
    if len(words) != 6 or words[0] != "PROXY" or words[1] not in ("TCP4", "TCP6"):
        raise RequestError(400, "invalid PROXY line")
    family = socket.AF_INET if words[1] == "TCP4" else socket.AF_INET6
    try:
        for address in words[2:4]:
            socket.inet_pton(family, address)
        ports = [int(word) for word in words[4:6]]
    except (OSError, ValueError):
        raise RequestError(400, "invalid PROXY line") from None
    if not all(0 <= port <= 65535 for port in ports) or not all(
            word.isdigit() for word in words[4:6]):
        raise RequestError(400, "invalid PROXY line")
    return ProxyInfo(words[2], ports[0])


def v2_length(head: bytes) -> int:
    """Total length of a v2 header from its first 16 bytes."""
    return 16 + struct.unpack(">H", head[14:16])[0]


def parse_v2(header: bytes) -> ProxyInfo:
    """A whole v2 header (signature included). Raises RequestError(400) if invalid."""
    if header[:12] != V2_SIGNATURE or len(header) < 16 or len(header) != v2_length(header):
        raise RequestError(400, "invalid PROXY v2 header")
    version, command = header[12] >> 4, header[12] & 0x0F
    if version != 2 or command not in (0, 1):
        raise RequestError(400, "unsupported PROXY v2 version or command")
    if command == 0:  # LOCAL: the proxy's own connection (health checks)
        return ProxyInfo()
    family, transport = header[13] >> 4, header[13] & 0x0F
    body = header[16:]
    if family == 0:  # UNSPEC
        return ProxyInfo()
    if transport != 1:
        raise RequestError(400, "PROXY v2: only TCP (STREAM) is supported")
    if family == 1 and len(body) >= 12:
        return ProxyInfo(socket.inet_ntop(socket.AF_INET, body[0:4]),
                         struct.unpack(">H", body[8:10])[0])
    if family == 2 and len(body) >= 36:
        return ProxyInfo(socket.inet_ntop(socket.AF_INET6, body[0:16]),
                         struct.unpack(">H", body[32:34])[0])
    raise RequestError(400, "PROXY v2: unsupported or short address block")


class ProxyPolicy:
    """One server's proxy settings, applied to each connection and request."""

    def __init__(self, forwarded_allow_ips=("127.0.0.1", "::1"), secure_scheme_headers=None,
                 proxy_protocol="off", proxy_allow_ips=("127.0.0.1", "::1")):
        self.forwarded = AddressList(forwarded_allow_ips)
        headers = secure_scheme_headers if secure_scheme_headers is not None else {
            "X-FORWARDED-PROTOCOL": "ssl", "X-FORWARDED-PROTO": "https",
            "X-FORWARDED-SSL": "on"}
        self.secure_headers = tuple(("HTTP_" + name.upper().replace("-", "_"), value)
                                    for name, value in headers.items())
        #: their environ keys: most requests carry none, and then the peer
        #: need not be looked up
        self._secure_keys = tuple(key for key, _ in self.secure_headers)
        self.protocol = proxy_protocol
        self.proxies = AddressList(proxy_allow_ips)

    def adjust(self, environ, peer, info=None):
        """Set wsgi.url_scheme (and the client from a PROXY header) in the
        `environ` of one request from `peer`. The handler takes the two
        steps apart: set_client once per connection, set_scheme for a
        request that has one of its scheme_keys."""
        self.set_client(environ, info)
        for key in self.scheme_keys(peer):
            if key in environ:
                self.set_scheme(environ)
                break

    def scheme_keys(self, peer):
        """The environ keys of the scheme headers to look for in `peer`'s
        requests: none when the peer is not trusted to set the scheme (its
        headers are then ignored)."""
        return self._secure_keys if peer in self.forwarded else ()

    @staticmethod
    def set_client(environ, info):
        """The client a PROXY header (`info`, or None) names, as REMOTE_ADDR and REMOTE_PORT."""
        if info is not None and info.client_addr is not None:
            environ["REMOTE_ADDR"] = info.client_addr
            environ["REMOTE_PORT"] = str(info.client_port)

    def set_scheme(self, environ):
        """wsgi.url_scheme from a trusted peer's scheme headers; RequestError
        if they contradict each other."""
        scheme = scheme_from_headers(environ, self.secure_headers)
        if scheme is not None:
            environ["wsgi.url_scheme"] = scheme

    def read_header(self, rfile, peer):
        """Consume a PROXY header at the start of a connection, if one is there.

        Returns a ProxyInfo, or None when PROXY protocol is off or the
        connection starts with something else. Raises RequestError (400 for
        a malformed header, 403 for one from a peer not in proxy_allow_ips).
        """
        if self.protocol == "off":
            return None
        # What the first read brought: proxies send the header in one write,
        # so it is all there (a buffered reader's peek cannot wait for more).
        start = rfile.peek(16)
        if self.protocol in ("v2", "auto") and start[:12] == V2_SIGNATURE:
            self._check_peer(peer)
            head = rfile.read(16)
            if len(head) < 16:
                raise RequestError(400, "truncated PROXY v2 header")
            rest = rfile.read(v2_length(head) - 16)
            return parse_v2(head + rest)
        if self.protocol in ("v1", "auto") and start[:6] == b"PROXY ":
            self._check_peer(peer)
            line = rfile.readline(_V1_MAX)
            if not line.endswith(b"\r\n"):
                raise RequestError(400, "invalid PROXY line")
            return parse_v1(line[:-2])
        return None

    def _check_peer(self, peer):
        if peer not in self.proxies:
            raise RequestError(403, "PROXY header from an address not in proxy_allow_ips")
