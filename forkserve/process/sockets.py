"""Listening sockets: parse addresses, bind early, listen late.

The master binds every address before it loads the application, so a port
in use fails in a second rather than after a long dataset load. It calls
`listen()` only once the application is loaded, so no load balancer or
health check ever connects to a server that cannot answer yet (connections
to a bound but not listening TCP port are refused).

The sockets are plain (unpatched) socket objects owned by the master; each
worker wraps the inherited file descriptors in gevent sockets.
"""

import errno
import os
import socket
import stat

__all__ = ["Address", "BindError", "parse_address", "bind", "describe", "split_protocol",
           "protocols", "PROTOCOLS"]

#: what a listener may speak; a bind address may name it as a prefix
#: ("uwsgi:127.0.0.1:3031", "uwsgi:unix:/run/app.sock", "http:0.0.0.0:8000"),
#: else it speaks the `protocol` setting's (Gunicorn's --protocol)
PROTOCOLS = ("http", "uwsgi")

#: errno values that mean "the address cannot be had", each with advice.
_BIND_ADVICE = {
    errno.EADDRINUSE: "address already in use. Is another server running there? "
                      "Pick another with -b HOST:PORT, or -b HOST:0 for any free port",
    errno.EACCES: "permission denied. Ports below 1024 need root; use a higher port",
    errno.EADDRNOTAVAIL: "this machine has no such address; use 127.0.0.1 or 0.0.0.0",
}


class BindError(Exception):
    """An address could not be parsed or bound. The message says what to do."""


class Address:
    """A parsed bind address: a TCP (host, port) or a unix socket path."""

    def __init__(self, family, target, text):
        self.family = family
        self.target = target
        self.text = text

    @property
    def is_unix(self):
        return self.family == socket.AF_UNIX

    def __repr__(self):
        return f"Address({self.text!r})"


def split_protocol(text: str):
    """(protocol, address) of a bind address: the protocol its prefix names,
    or None without one."""
    text = text.strip()
    prefix, sep, rest = text.partition(":")
    if sep and prefix in PROTOCOLS and rest:
        return prefix, rest
    return None, text


def protocols(texts, default: str, count: int) -> list:
    """The protocol of each of `count` listeners bound (or adopted) from the
    bind addresses `texts`, in order. Listeners that systemd passed, when
    their number differs from the addresses', all speak `default`."""
    if len(texts) != count:
        return [default] * count
    return [split_protocol(text)[0] or default for text in texts]


def parse_address(text: str) -> Address:
    text = split_protocol(text)[1]
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if not path:
            raise BindError(f"bind address {text!r} has no path; write unix:/run/app.sock")
        return Address(socket.AF_UNIX, path, text)
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise BindError(f"bind address {text!r}: write IPv6 addresses as [::1]:8000")
        port_text = rest[1:] if rest else "8000"
        family = socket.AF_INET6
    else:
        if text.count(":") > 1:
            raise BindError(f"bind address {text!r}: put IPv6 addresses in brackets, [::1]:8000")
        host, _, port_text = text.rpartition(":")
        if not _:
            host, port_text = text, "8000"
        host = host or "0.0.0.0"
        family = socket.AF_INET
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise BindError(f"bind address {text!r}: the port must be a number from 0 to 65535")
    if family == socket.AF_INET:
        try:
            infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise BindError(f"bind address {text!r}: cannot resolve {host!r}: {exc.strerror}") \
                from None
        family = infos[0][0]
        host = infos[0][4][0]
    return Address(family, (host, port), text)


def bind(address: Address) -> socket.socket:
    """Create and bind (but do not listen on) a socket for `address`."""
    sock = socket.socket(address.family, socket.SOCK_STREAM)
    try:
        if address.is_unix:
            _remove_stale_unix_socket(address.target)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if address.family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address.target)
    except OSError as exc:
        sock.close()
        advice = _BIND_ADVICE.get(exc.errno)
        if advice is None:
            raise BindError(f"cannot bind {address.text}: {exc.strerror or exc}") from None
        raise BindError(f"cannot bind {address.text}: {advice}") from None
    sock.set_inheritable(True)
    return sock


def _remove_stale_unix_socket(path):
    """Remove a leftover socket file, refusing to touch anything else."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise BindError(f"cannot bind unix:{path}: a file that is not a socket is there; "
                        "choose another path") from None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
    else:
        raise BindError(f"cannot bind unix:{path}: another server is accepting on it") from None
    finally:
        probe.close()


def describe(sock: socket.socket, protocol: str = "http") -> str:
    """The URL a client would use for a bound socket, with the real port."""
    if sock.family == socket.AF_UNIX:
        return ("uwsgi:" if protocol == "uwsgi" else "") + "unix:" + sock.getsockname()
    host, port = sock.getsockname()[:2]
    if sock.family == socket.AF_INET6:
        host = f"[{host}]"
    return f"{protocol}://{host}:{port}"


def bind_all(texts) -> list:
    """Bind every address; on any failure close what was bound and raise."""
    bound = []
    try:
        for text in texts:
            bound.append(bind(parse_address(text)))
    except BindError:
        close_all(bound, unlink=False)
        raise
    return bound


def close_all(sockets, *, unlink=True):
    for sock in sockets:
        if sock.fileno() == -1:
            continue  # already closed
        path = sock.getsockname() if sock.family == socket.AF_UNIX else None
        sock.close()
        if unlink and path:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
