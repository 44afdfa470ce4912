"""The RFC 9110/9112 cases (tests/rfc_corpus.py) end to end, against a real
forkserve over a socket: every valid request served as the RFCs say, every
invalid one refused with its status. tests/test_corpus.py runs the same
cases on the connection object alone; benchmarks/http_corpus.py beside
Gunicorn. (No "corpus" in the names here: `pytest -k corpus` selects the
socket-free tests.)"""

import os
import shutil

import pytest

from conftest import APPS
from forkserve_testing import ServerProcess
from tls_pki import client_context, make_pki
from rfc_corpus import CASES, CORPUS_LIMITS, exchange, verdict


LIMITS = [arg for name, value in CORPUS_LIMITS.items() for arg in (f"--{name}", str(value))]


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    server = ServerProcess(["-w", "0", *LIMITS], app="echo_environ:app", cwd=str(APPS),
                           log_dir=str(tmp_path_factory.mktemp("rfc")))
    try:
        yield server.wait_listening()
    finally:
        server.kill_group()


@pytest.fixture(scope="module")
def tls_port(tmp_path_factory):
    """The same server behind TLS (certfile): (port, a client's context)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make the certificates")
    pki = make_pki(str(tmp_path_factory.mktemp("pki")))
    server = ServerProcess(["-w", "0", *LIMITS, "--certfile", os.path.join(pki, "server.pem"),
                            "--keyfile", os.path.join(pki, "server.key")],
                           app="echo_environ:app", cwd=str(APPS),
                           log_dir=str(tmp_path_factory.mktemp("rfc")))
    try:
        yield server.wait_listening(), client_context(pki)
    finally:
        server.kill_group()


@pytest.mark.e2e
@pytest.mark.parametrize("case", CASES, ids=[f"{c.section} {c.name}" for c in CASES])
def test_rfc_case_against_a_real_server(port, case):
    passed, happened = verdict(case, *exchange(port, case.raw))
    assert passed, f"{case.section} {case.name}: expected {case.expect}, {happened}"


@pytest.mark.e2e
@pytest.mark.parametrize("case", CASES, ids=[f"{c.section} {c.name}" for c in CASES])
def test_rfc_case_against_a_real_server_behind_tls(tls_port, case):
    passed, happened = verdict(case, *exchange(*tls_port[:1], case.raw, tls=tls_port[1]))
    assert passed, f"{case.section} {case.name} over TLS: expected {case.expect}, {happened}"
