"""forkserve.http.tls's decisions with no socket: when a failed handshake is
logged, and what the settings may and may not ask."""

import logging
import types

import pytest

from forkserve.http import tls


def test_failed_handshakes_are_logged_once_per_interval_with_their_count():
    now = [100.0]
    log = tls.HandshakeLog(clock=lambda: now[0])
    assert log.failed("10.0.0.1", "no shared cipher") == \
        "TLS handshake with 10.0.0.1 failed: no shared cipher"
    for _ in range(499):
        now[0] += 0.01
        assert log.failed("10.0.0.2", "the client spoke plain HTTP") is None
    now[0] = 110.5
    assert log.failed("10.0.0.3", "unknown ca") == (
        "500 TLS handshakes failed in the last 10 s; the last, with 10.0.0.3: unknown ca")
    now[0] = 200.0
    assert log.failed("10.0.0.4", "x") == "TLS handshake with 10.0.0.4 failed: x"


def settings(**given):
    values = dict(certfile=None, keyfile=None, ca_certs=None, cert_reqs=0, ciphers=None,
                  proxy_protocol="off")
    values.update(given)
    return types.SimpleNamespace(**values)


def test_no_certfile_makes_no_context():
    assert tls.load(settings()) is None and tls.context is None


@pytest.mark.parametrize("given", [dict(cert_reqs=2), dict(ca_certs="ca.pem"),
                                   dict(keyfile="k.pem")])
def test_tls_tuning_without_certfile_serves_plain_http_with_a_warning(given, caplog):
    with caplog.at_level(logging.WARNING, "forkserve.error"):
        assert tls.load(settings(**given)) is None
    assert "have no effect without certfile" in caplog.text


def test_proxy_protocol_and_certfile_together_are_refused():
    with pytest.raises(tls.TLSError, match="PROXY header would come before"):
        tls.load(settings(certfile="c.pem", proxy_protocol="v1"))


def test_an_ssl_context_hook_must_return_a_context():
    with pytest.raises(tls.TLSError, match="return default_ssl_context_factory"):
        tls.load(settings(certfile="c.pem"), lambda config, factory: None)
