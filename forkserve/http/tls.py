"""TLS on HTTP listeners (certfile, keyfile, ca_certs, cert_reqs, ciphers,
suppress_ragged_eofs, the ssl_context hook), with the standard library's ssl.

The context is made once, in the master, at start (`load`): a missing file,
a key that does not match its certificate or a bad cipher list stops the
start with a message that names it. A reload (HUP) starts a new generation,
which loads the files again: new connections get the replaced certificate.
Workers inherit the context with the heap.

A connection's TLS runs over memory buffers (ssl.SSLObject with two
MemoryBIOs), not an ssl.SSLSocket: the transport keeps its own reads and
writes of the socket (forkserve.http.transport), and a TLS connection only
changes what they carry.

Invariants:
- The handshake is made by the connection's first read, so it runs under
  header_timeout like the request head it precedes (a client that does not
  finish it is closed quietly at the timeout, and can be shed as a head).
  A failed handshake (plain HTTP to the port, an unknown or missing client
  certificate, no shared cipher) sends the TLS alert and ends the connection
  as a client that closed; the failures are logged at most once per
  `HandshakeLog.interval`, with their count and the last reason.
- Ciphertext reaches the socket in the order it was made: everything the
  SSLObject writes goes to one outgoing buffer, and whoever empties it
  writes those bytes before anything made after (a response sealed while an
  earlier one's rest is still waiting for the client is queued behind it, by
  Transport's own rules).
- os.sendfile() cannot encrypt: TLS listeners send files in blocks.
"""

import errno
import logging
import ssl
import time

from forkserve.http.transport import READ_BUFFER, Reader, Transport

__all__ = ["load", "context", "Listener", "HandshakeLog", "TLSError"]

log = logging.getLogger("forkserve.error")


class TLSError(ValueError):
    """The TLS settings cannot make a context; the message says which file and why."""


#: the process's TLS context (made by load() in the master, inherited by workers), or None
context = None


def load(cfg, hook=None):
    """Make the TLS context from the settings (None without certfile) and keep
    it for the workers. `hook` is the config file's ssl_context(config,
    default_factory), which Gunicorn calls the same way."""
    global context
    context = None
    if not cfg.certfile:
        if cfg.keyfile or cfg.ca_certs or cfg.cert_reqs:  # Gunicorn starts so too
            log.warning("keyfile, ca_certs and cert_reqs have no effect without certfile: "
                        "the listeners serve plain HTTP; give the server's certificate with "
                        "--certfile to serve TLS")
        return None
    if cfg.proxy_protocol != "off":
        raise TLSError("proxy_protocol and certfile together: the PROXY header would come "
                       "before the TLS handshake, which forkserve does not read; terminate "
                       "TLS in the proxy that sends PROXY, or turn one of them off")

    def default_factory():
        made = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=cfg.ca_certs)
        made.load_cert_chain(certfile=cfg.certfile, keyfile=cfg.keyfile)
        made.verify_mode = ssl.VerifyMode(cfg.cert_reqs)
        if cfg.ciphers:
            made.set_ciphers(cfg.ciphers)
        return made

    try:
        made = hook(cfg, default_factory) if hook is not None else default_factory()
    except FileNotFoundError as exc:
        raise TLSError(f"TLS: {exc.filename or cfg.certfile}: no such file; check certfile, "
                       "keyfile and ca_certs") from None
    except PermissionError as exc:
        raise TLSError(f"TLS: {exc.filename}: permission denied; the master reads the "
                       "certificate and key before dropping privileges") from None
    except ssl.SSLError as exc:
        raise TLSError(f"TLS: cannot use certfile {cfg.certfile}"
                       f"{' with keyfile ' + cfg.keyfile if cfg.keyfile else ''}"
                       f"{' and ca_certs ' + cfg.ca_certs if cfg.ca_certs else ''}"
                       f"{' and ciphers ' + repr(cfg.ciphers) if cfg.ciphers else ''}: "
                       f"{exc.reason or exc}; check that the key matches the certificate "
                       "and both are PEM") from None
    if not isinstance(made, ssl.SSLContext):
        raise TLSError(f"the ssl_context hook returned {type(made).__name__}, not an "
                       "ssl.SSLContext: return default_ssl_context_factory() or a context "
                       "it made")
    context = made
    return made


#: OpenSSL's reasons that say more in words
_REASONS = {
    "HTTP_REQUEST": "the client spoke plain HTTP to this TLS port (use https://)",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no client certificate, and cert_reqs = 2 requires one",
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust this server's certificate",
    "CERTIFICATE_VERIFY_FAILED": "the client certificate is not signed by ca_certs",
}


class HandshakeLog:
    """Says when to log failed handshakes: the first at once, then at most one
    line per `interval` with the count since the last line and the last
    reason. A scanner or a misconfigured client fails a handshake per
    connection; one line each would flood the log."""

    #: seconds between two lines
    interval = 10.0

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._last_line = None
        self._failures = 0

    def failed(self, peer, reason):
        """A handshake with `peer` failed for `reason`: the line to log now, or None."""
        self._failures += 1
        now = self._clock()
        last = self._last_line
        if last is not None and now - last < self.interval:
            return None
        self._last_line = now
        count, self._failures = self._failures, 0
        if last is None or count == 1:
            return f"TLS handshake with {peer} failed: {reason}"
        return (f"{count} TLS handshakes failed in the last {now - last:.0f} s; the last, "
                f"with {peer}: {reason}")


class Listener:
    """What one worker's TLS listeners share: the context, the settings, and
    the handshake failures' log."""

    def __init__(self, ssl_context, logger, *, suppress_ragged_eofs=True, clock=time.monotonic):
        self.context = ssl_context
        self.logger = logger
        self.suppress_ragged_eofs = suppress_ragged_eofs
        self.failures = HandshakeLog(clock)

    def transport(self, sock, loop, send_timeout, outbox, peer):
        return TLSTransport(self, sock, loop, send_timeout, outbox, peer)

    def handshake_failed(self, peer, exc):
        reason = getattr(exc, "reason", None) or str(exc)
        line = self.failures.failed(peer, _REASONS.get(reason, reason))
        if line is not None:
            self.logger.warning("%s", line)


class TLSTransport(Transport):
    """A Transport whose writes are sealed by the connection's SSLObject and
    whose reader opens what the client sent."""

    def __init__(self, listener, sock, loop, send_timeout, outbox, peer):
        super().__init__(sock, loop, send_timeout, outbox)
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = listener.context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.reader = TLSReader(self, listener, peer, self.reader)

    def send(self, data):
        if self.held or self._rest is not None or self._failure is not None:
            self.settle()  # what was made before goes first
        if data:
            self.tls.write(data)
        super().send(self._outgoing.read())

    def write_held(self, data, line):
        # (a cut response's line then counts sealed bytes, which a few TLS
        # records' framing makes a little larger than the body's)
        if self._failure is None:  # sealed now: behind whatever rest was made before
            self.tls.write(data)
            data = self._outgoing.read()
        super().write_held(data, line)

    def flush_out(self):
        """Write what the SSLObject made by itself (handshake, alerts), now."""
        if self._outgoing.pending:
            super().send(self._outgoing.read())

    def close(self):
        try:
            super().close()
        finally:
            self.reader.transport = None  # the cycle through the reader


class TLSReader(Reader):
    """The connection's reads, opened: the handshake on the first read, then
    the plaintext of what arrives (b"" at the client's close)."""

    __slots__ = ("transport", "_listener", "_peer", "_raw", "_ready")

    def __init__(self, transport, listener, peer, raw_reader):
        self.transport = transport
        self._listener = listener
        self._peer = peer
        self._raw = raw_reader  # the socket's own reads
        self._ready = False

    def recv(self, wait_first=False):
        """Plaintext, waiting for the socket as needed (b"" at EOF; a failed
        handshake reads as EOF). The socket is waited on only when the
        SSLObject has nothing left to open: a pipelined request may already
        be buffered."""
        if not self._ready and not self._handshake():
            return b""
        tls = self.transport.tls
        while True:
            try:
                return tls.read(READ_BUFFER)
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:  # close_notify
                return b""
            except ssl.SSLEOFError:
                return self._ragged_eof()
            self.transport.flush_out()  # a KeyUpdate's answer, say
            self._feed(self._raw.recv())  # at EOF, the next read says how it ended

    def read_now(self):
        if not self._ready:
            return None
        tls = self.transport.tls
        for _ in range(2):
            try:
                return tls.read(READ_BUFFER)
            except ssl.SSLWantReadError:
                raw = self._raw.read_now()
                if raw is None:
                    return None
                if not self._feed(raw):
                    return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
        return None

    def _feed(self, raw):
        """Give the SSLObject what the socket brought; False at EOF."""
        if not raw:
            self.transport._incoming.write_eof()
            return False
        self.transport._incoming.write(raw)
        return True

    def _ragged_eof(self):
        """The client closed without close_notify."""
        if self._listener.suppress_ragged_eofs:
            return b""
        raise ConnectionResetError(errno.ECONNRESET, "TLS connection closed without "
                                   "close_notify (suppress_ragged_eofs is off)")

    def _handshake(self):
        """Run the handshake; False (logged, rate-limited) if it failed."""
        transport = self.transport
        tls = transport.tls
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                transport.flush_out()
                raw = self._raw.recv()
                if not raw:  # gone before the handshake ended: a quiet close
                    return False
                transport._incoming.write(raw)
            except ssl.SSLError as exc:
                self._listener.handshake_failed(self._peer, exc)
                try:
                    transport.flush_out()  # the alert that says why
                except OSError:  # ClientDisconnected too: gone already
                    pass
                return False
        transport.flush_out()
        self._ready = True
        return True

    def close(self):
        self._raw.close()
