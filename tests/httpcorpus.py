"""Raw HTTP/1.x requests for tests/test_http.py: good ones, and bad ones by
class with the status forkserve answers them with (then closing).

The sizes assume the limits in LIMITS, which the tests give the server.
"""

LIMITS = dict(limit_request_line=1024, limit_request_fields=20, limit_request_field_size=512,
              limit_request_body=1024, header_timeout=1.0, keep_alive=1.0)


def request(line="GET / HTTP/1.1", headers=("Host: t",), body=b""):
    head = "".join(f"{h}\r\n" for h in headers)
    return f"{line}\r\n{head}\r\n".encode("latin-1") + body


def post(headers, body):
    return request("POST /echo HTTP/1.1", ("Host: t", *headers), body)


def chunked(*chunk_lines, trailer=b"\r\n"):
    """A chunked /echo request whose body is the given raw chunk lines."""
    return post(["Transfer-Encoding: chunked"], b"".join(chunk_lines) + trailer)


GOOD = [
    request(),
    request("GET /path/x?q=1&r=%20 HTTP/1.1", ("Host: example.com", "Accept: */*",
                                                "User-Agent: test", "X-Forwarded-For: 10.0.0.1")),
    request("HEAD / HTTP/1.1"),
    request("GET / HTTP/1.0", ()),
    request("GET http://example.com/abs?x=1 HTTP/1.1"),
    request("GET / HTTP/1.2"),  # a higher minor version is served as HTTP/1.1
    request("OPTIONS * HTTP/1.1"),
    b"\r\n" + request(),  # one empty line before the request line is ignored
    post(["Content-Length: 11", "Content-Type: text/plain"], b"hello world"),
    chunked(b"5\r\nhello\r\n", b"6;ext=1;q=\"a b\"\r\n world\r\n", b"0\r\n", trailer=b"X-T: 1\r\n\r\n"),
    request() + request("GET /generator HTTP/1.1"),  # pipelined
    request(headers=("Host: t", "Cookie: a=1", "Cookie: b=2", "Connection: close")),
]

_CL_CHUNKED = ["Content-Length: 5", "Transfer-Encoding: chunked"]

# class -> (status, [raw requests])
REJECTED = {
    "request_line_over_limit": (414, [
        request("GET /" + "a" * 1100 + " HTTP/1.1"),
        b"GET /" + b"a" * 5000,  # never ends
    ]),
    "too_many_header_fields": (431, [
        request(headers=["Host: t"] + [f"X-H{i}: v" for i in range(25)]),
    ]),
    "header_field_over_size": (431, [
        request(headers=["Host: t", "X-Big: " + "v" * 600]),
        request(headers=["Host: t", "X-" + "n" * 600 + ": v"]),
    ]),
    "content_length_over_body_limit": (413, [
        post(["Content-Length: 2000"], b"x" * 2000),
        post(["Content-Length: 1025", "Expect: 100-continue"], b""),
    ]),
    "chunked_body_over_body_limit": (413, [
        chunked(b"190\r\n" + b"x" * 400 + b"\r\n", b"190\r\n" + b"x" * 400 + b"\r\n",
                b"190\r\n" + b"x" * 400 + b"\r\n", b"0\r\n"),
        chunked(b"fffffff\r\n" + b"x" * 10),
    ]),
    "content_length_with_transfer_encoding": (400, [
        post(_CL_CHUNKED, b"5\r\nhello\r\n0\r\n\r\n"),
        post(_CL_CHUNKED[::-1], b"5\r\nhello\r\n0\r\n\r\n"),
        post(["Content-Length: 0", "Transfer-Encoding: gzip"], b""),
    ]),
    "duplicate_content_length": (400, [
        post(["Content-Length: 5", "Content-Length: 5"], b"hello"),
        post(["Content-Length: 5", "Content-Length: 6"], b"hello!"),
        post(["Content-Length: 5", "content-length: 5"], b"hello"),
    ]),
    "malformed_content_length": (400, [
        post([f"Content-Length: {value}"], b"hello")
        for value in ("+5", "-5", "0x5", "5 5", "5,5", "", "5.0", "1e1", "\xb2", "9" * 19, "5\x0b")
    ]),
    "invalid_chunk_size": (400, [
        chunked(line + b"\r\nhello\r\n", b"0\r\n")
        for line in (b"g", b"-5", b"0x5", b"+5", b" 5", b"5 ", b"", b"0" * 16 + b"5", b"5\t")
    ]),
    "malformed_chunk_extension": (400, [
        chunked(b"5" + ext + b"\r\nhello\r\n", b"0\r\n")
        for ext in (b";", b";=x", b";a=", b';a="open', b";a b", b";a=b c", b";a=\x00", b";a,b")
    ]),
    "chunk_data_not_ending_in_crlf": (400, [
        chunked(b"5\r\nhello!!\r\n", b"0\r\n"),
        chunked(b"5\r\nhelloXX", b"0\r\n"),
    ]),
    "bare_lf_line_ending": (400, [
        b"GET / HTTP/1.1\nHost: t\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\n\n",
        chunked(b"5\nhello\r\n", b"0\r\n"),
        chunked(b"5\r\nhello\r\n", b"0\n"),
    ]),
    "control_characters": (400, [
        request("GET /a\x00b HTTP/1.1"),
        request("GET /a\x1b[31m HTTP/1.1"),
        request("G\x01ET / HTTP/1.1"),
        request(headers=("Host: t", "X-A: a\x00b")),
        request(headers=("Host: t", "X-A: a\x7fb")),
        request(headers=("Host: t", "X-A: a\rb")),
        request(headers=("Host: t", "X-A: a\x0bb")),
        request(headers=("Host: t", "X-\x00A: b")),
        b"GET / HTTP/1.1\rHost: t\r\n\r\n",
    ]),
    "obsolete_line_folding": (400, [
        request(headers=("Host: t", "X-A: a", "  folded")),
        request(headers=("Host: t", "X-A: a", "\tfolded")),
        request(headers=(" Host: t",)),
    ]),
    "transfer_encoding_not_ending_in_chunked": (400, [
        post([f"Transfer-Encoding: {value}"], b"5\r\nhello\r\n0\r\n\r\n")
        for value in ("chunked, identity", "xchunked", "identity", "chunked, chunked",
                      "chunked;q=1", "", "chunked,", "chunked\x0b")
    ] + [post(["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], b"0\r\n\r\n")]),
    "unsupported_transfer_coding": (501, [
        post([f"Transfer-Encoding: {value}"], b"5\r\nhello\r\n0\r\n\r\n")
        for value in ("gzip, chunked", "deflate,chunked", "x-custom, chunked")
    ]),
    "transfer_encoding_in_http10": (400, [
        request("POST /echo HTTP/1.0", ("Transfer-Encoding: chunked",), b"5\r\nhello\r\n0\r\n\r\n"),
    ]),
    "malformed_http_version": (400, [
        request(f"GET / {version}")
        for version in ("HTTP/1.10", "HTTP/1.1.1", "HTTP/1.x", "http/1.1", "HTTP/11", "HTTP1.1",
                        "HTTP/1", "HTTP/01.1", "HTTP/\xb9.\xb9", "HTTPS/1.1")
    ]),
    "unsupported_http_version": (505, [
        request(f"GET / {version}") for version in ("HTTP/2.0", "HTTP/0.9", "HTTP/3.0", "HTTP/9.1")
    ] + [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]),
    "request_line_without_version": (400, [
        b"GET /\r\n",
        b"GET\r\n\r\n",
    ]),
    "invalid_method_token": (400, [
        request(f"{method} / HTTP/1.1") for method in ("GE(T", "G@T", "GET,", "[GET]", "G\xc9T", "GE/T")
    ]),
    "whitespace_before_header_colon": (400, [
        request(headers=("Host : t",)),
        request(headers=("Host: t", "Content-Length\t: 0")),
        post(["Transfer-Encoding : chunked"], b"0\r\n\r\n"),
    ]),
    "invalid_header_name": (400, [
        request(headers=("Host: t", f"{name}: v"))
        for name in ("X(a)", 'X"a', "X[a]", "\xffname", "", "X a", "X/a", "X@a", "X=a", "X{a}")
    ]),
    "duplicate_host": (400, [
        request(headers=("Host: a", "Host: b")),
        request(headers=("Host: a", "host: a")),
    ]),
    "unsupported_request_target": (400, [
        request("GET * HTTP/1.1"),
        request("GET relative/path HTTP/1.1"),
        request("GET ftp://example.com/ HTTP/1.1"),
        request("GET /p?q=1#frag HTTP/1.1"),
        request("GET /caf\xe9 HTTP/1.1"),
        request("GET http://user@example.com/ HTTP/1.1"),
    ]),
    "connect_method": (501, [
        request("CONNECT example.com:443 HTTP/1.1", ("Host: example.com:443",)),
    ]),
    "missing_or_invalid_host": (400, [
        request(headers=()),
        request(headers=("Host: a b",)),
        request(headers=("Host: a/b",)),
        request(headers=("Host: a:8x",)),
    ]),
    "duplicate_content_type": (400, [
        post(["Content-Length: 2", "Content-Type: a/b", "Content-Type: a/b"], b"hi"),
    ]),
    "misplaced_spaces_in_request_line": (400, [
        request(line) for line in ("GET  / HTTP/1.1", " GET / HTTP/1.1", "GET / HTTP/1.1 ",
                                   "GET\t/ HTTP/1.1", "GET /\tHTTP/1.1", "GET / a HTTP/1.1")
    ]),
}
