"""The RFC 9110/9112 cases (tests/rfc_corpus.py) end to end, against a real
forkserve over a socket: every valid request served as the RFCs say, every
invalid one refused with its status. tests/test_corpus.py runs the same
cases on the connection object alone; benchmarks/http_corpus.py beside
Gunicorn. (No "corpus" in the names here: `pytest -k corpus` selects the
socket-free tests.)"""

import pytest

from conftest import APPS
from forkserve_testing import ServerProcess
from rfc_corpus import CASES, CORPUS_LIMITS, exchange, verdict


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    limits = [arg for name, value in CORPUS_LIMITS.items() for arg in (f"--{name}", str(value))]
    server = ServerProcess(["-w", "0", *limits], app="echo_environ:app", cwd=str(APPS),
                           log_dir=str(tmp_path_factory.mktemp("rfc")))
    try:
        yield server.wait_listening()
    finally:
        server.kill_group()


@pytest.mark.e2e
@pytest.mark.parametrize("case", CASES, ids=[f"{c.section} {c.name}" for c in CASES])
def test_rfc_case_against_a_real_server(port, case):
    passed, happened = verdict(case, *exchange(port, case.raw))
    assert passed, f"{case.section} {case.name}: expected {case.expect}, {happened}"
