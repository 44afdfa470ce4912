"""Proxy headers and PROXY protocol: pure parsing and trust decisions (no sockets).
Behaviour beside the real Gunicorn is in test_gunicorn_e2e."""

import io
import socket
import struct

import pytest

from forkserve.http.h1 import RequestError
from forkserve.http.proxy import (AddressList, ProxyPolicy, V2_SIGNATURE, parse_v1, parse_v2,
                                  scheme_from_headers)

LOCAL = ("127.0.0.1", 40000)
REMOTE = ("203.0.113.5", 40000)


def scheme(policy, peer, **headers):
    environ = {"wsgi.url_scheme": "http", **{"HTTP_" + k: v for k, v in headers.items()}}
    policy.adjust(environ, peer)
    return environ["wsgi.url_scheme"]


def test_default_trusts_loopback_and_gunicorns_three_headers():
    policy = ProxyPolicy()
    assert scheme(policy, LOCAL, X_FORWARDED_PROTO="https") == "https"
    assert scheme(policy, LOCAL, X_FORWARDED_SSL="on") == "https"
    assert scheme(policy, LOCAL, X_FORWARDED_PROTOCOL="ssl") == "https"
    assert scheme(policy, ("::1", 1, 0, 0), X_FORWARDED_PROTO="https") == "https"
    assert scheme(policy, LOCAL, X_FORWARDED_PROTO="HTTPS") == "http"  # values are exact


def test_headers_from_an_untrusted_peer_are_ignored():
    assert scheme(ProxyPolicy(), REMOTE, X_FORWARDED_PROTO="https") == "http"


def test_unix_socket_peers_are_trusted():
    assert scheme(ProxyPolicy(["10.0.0.1"]), "", X_FORWARDED_PROTO="https") == "https"


@pytest.mark.parametrize("allowed, peer, trusted", [
    (["*"], REMOTE, True), (["203.0.113.0/24"], REMOTE, True), (["203.0.113.6"], REMOTE, False),
    (["2001:db8::/32"], ("2001:db8::7", 1, 0, 0), True), (["10.0.0.0/8"], LOCAL, False),
])
def test_forwarded_allow_ips_takes_addresses_networks_and_star(allowed, peer, trusted):
    assert (peer in AddressList(allowed)) is trusted


def test_contradicting_scheme_headers_are_a_400():
    headers = (("HTTP_X_FORWARDED_PROTO", "https"), ("HTTP_X_FORWARDED_SSL", "on"))
    with pytest.raises(RequestError) as caught:
        scheme_from_headers({"HTTP_X_FORWARDED_PROTO": "https", "HTTP_X_FORWARDED_SSL": "off"},
                            headers)
    assert caught.value.status == 400
    assert scheme_from_headers({"HTTP_X_FORWARDED_PROTO": "https",
                                "HTTP_X_FORWARDED_SSL": "on"}, headers) == "https"


def test_custom_secure_scheme_headers_replace_the_defaults():
    policy = ProxyPolicy(secure_scheme_headers={"X-Scheme": "https"})
    assert scheme(policy, LOCAL, X_SCHEME="https") == "https"
    assert scheme(policy, LOCAL, X_FORWARDED_PROTO="https") == "http"


def test_v1_lines():
    info = parse_v1(b"PROXY TCP4 192.0.2.1 192.0.2.2 5000 80")
    assert (info.client_addr, info.client_port) == ("192.0.2.1", 5000)
    info = parse_v1(b"PROXY TCP6 2001:db8::1 2001:db8::2 5000 80")
    assert (info.client_addr, info.client_port) == ("2001:db8::1", 5000)
    assert parse_v1(b"PROXY UNKNOWN").client_addr is None


@pytest.mark.parametrize("line", [b"PROXY TCP4 192.0.2.1 192.0.2.2 5000", b"PROXY UDP4 a b 1 2",
                                  b"PROXY TCP4 999.0.2.1 192.0.2.2 5000 80",
                                  b"PROXY TCP4 192.0.2.1 192.0.2.2 70000 80",
                                  b"PROXY TCP4 192.0.2.1 192.0.2.2 +5 80"])
def test_bad_v1_lines_are_a_400(line):
    with pytest.raises(RequestError) as caught:
        parse_v1(line)
    assert caught.value.status == 400


def v2(command=0x21, family=0x11, body=None):
    if body is None:
        body = socket.inet_aton("192.0.2.1") + socket.inet_aton("192.0.2.2") + struct.pack(
            ">HH", 5000, 80)
    return V2_SIGNATURE + bytes([command, family]) + struct.pack(">H", len(body)) + body


def test_v2_headers():
    info = parse_v2(v2())
    assert (info.client_addr, info.client_port) == ("192.0.2.1", 5000)
    body6 = (socket.inet_pton(socket.AF_INET6, "2001:db8::1") +
             socket.inet_pton(socket.AF_INET6, "2001:db8::2") + struct.pack(">HH", 6000, 80))
    info = parse_v2(v2(family=0x21, body=body6))
    assert (info.client_addr, info.client_port) == ("2001:db8::1", 6000)
    assert parse_v2(v2(command=0x20, body=b"")).client_addr is None  # LOCAL


@pytest.mark.parametrize("header", [v2(command=0x31), v2(command=0x22), v2(family=0x12),
                                    v2(body=b"\x00" * 4)])
def test_bad_v2_headers_are_a_400(header):
    with pytest.raises(RequestError):
        parse_v2(header)


def read(policy, data, peer=LOCAL):
    rfile = io.BufferedReader(io.BytesIO(data))
    return policy.read_header(rfile, peer), rfile.read()


def test_a_proxy_header_is_consumed_and_the_request_follows():
    request = b"GET / HTTP/1.1\r\n\r\n"
    info, rest = read(ProxyPolicy(proxy_protocol="auto"),
                      b"PROXY TCP4 192.0.2.1 192.0.2.2 5000 80\r\n" + request)
    assert info.client_addr == "192.0.2.1" and rest == request
    info, rest = read(ProxyPolicy(proxy_protocol="v2"), v2() + request)
    assert info.client_port == 5000 and rest == request
    info, rest = read(ProxyPolicy(proxy_protocol="auto"), request)
    assert info is None and rest == request
    info, rest = read(ProxyPolicy(proxy_protocol="v2"), b"PROXY TCP4 a b 1 2\r\n")
    assert info is None  # v2 only: a v1 line is left to the HTTP parser, which refuses it


@pytest.mark.parametrize("pieces", [1, 3, 7])
@pytest.mark.parametrize("header", [b"PROXY TCP4 192.0.2.1 192.0.2.2 5000 80\r\n", v2()])
def test_a_proxy_header_read_from_the_connection_buffer_leaves_the_request_there(header, pieces):
    """The handler reads the header through the connection object's own
    buffer (one receive buffer): the request that came with it is the
    connection's first event, however the reads split what follows the
    header's first bytes (a proxy writes its header in one write; a v1 line
    may still arrive in parts)."""
    from forkserve.http.handler import Preamble
    from forkserve.http.h1 import Limits
    from forkserve.http.protocol import Connection, Request
    data = header + b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n"
    first = 16 if header.startswith(b"PROXY") else len(header)
    size = -(-(len(data) - first) // pieces)
    reads = [data[:first]] + [data[i:i + size] for i in range(first, len(data), size)] + [b""]
    connection = Connection(Limits())
    info = ProxyPolicy(proxy_protocol="auto").read_header(
        Preamble(connection, lambda: reads.pop(0)), LOCAL)
    assert info.client_port == 5000
    while not connection.buffered or reads and b"\r\n\r\n" not in connection.trailing_data:
        connection.receive_data(reads.pop(0))
    event = connection.next_event()
    assert isinstance(event, Request) and event.target == "/x"


def test_a_proxy_header_from_a_peer_not_in_proxy_allow_ips_is_a_403():
    with pytest.raises(RequestError) as caught:
        read(ProxyPolicy(proxy_protocol="v1"), b"PROXY TCP4 192.0.2.1 192.0.2.2 5000 80\r\n",
             peer=REMOTE)
    assert caught.value.status == 403


def test_the_proxy_header_sets_remote_addr_and_port():
    environ = {"REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "4", "wsgi.url_scheme": "http"}
    info = parse_v1(b"PROXY TCP4 192.0.2.1 192.0.2.2 5000 80")
    ProxyPolicy().adjust(environ, LOCAL, info)
    assert (environ["REMOTE_ADDR"], environ["REMOTE_PORT"]) == ("192.0.2.1", "5000")
