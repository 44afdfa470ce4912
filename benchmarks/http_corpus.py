"""Run the RFC 9110/9112 request corpus (tests/rfc_corpus.py) against forkserve
and Gunicorn (gevent worker) side by side, and count what each got right.

    python benchmarks/http_corpus.py            # needs gunicorn (pip install -e '.[bench]')

Both servers run tests/apps/echo_environ.py with the same --limit-request-*
numbers (rfc_corpus.CORPUS_LIMITS). A valid case counts as right when it is
served with the environ the RFCs imply; an invalid case when it is refused
(any 4xx/5xx or a close without a response; the status forkserve gives is in
the corpus and shown). Cases where the two servers differ are listed.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
sys.path[:0] = [str(TESTS), str(ROOT)]

from rfc_corpus import CASES, CORPUS_LIMITS, Serve, exchange, verdict  # noqa: E402

from benchmarks.harness.start import start as start_server  # noqa: E402

SERVERS = {
    "forkserve": [sys.executable, "-m", "forkserve", "-w", "1", "-b", "127.0.0.1:0"],
    "gunicorn": [sys.executable, "-m", "gunicorn", "-k", "gevent", "-w", "1", "-b", "127.0.0.1:0"],
}


def start(name, log_path):
    limits = [arg for key, value in CORPUS_LIMITS.items() for arg in (f"--{key}", str(value))]
    return start_server(SERVERS[name] + limits + ["echo_environ:app"], log_path=log_path,
                        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=TESTS / "apps",
                        processes=2, probe_path="/")


def main():
    outcomes = {}
    for name in SERVERS:
        with start(name, f"/tmp/http-corpus-{name}.log") as server:
            outcomes[name] = [verdict(case, *exchange(server.port, case.raw), exact=False)
                              for case in CASES]
    valid = [isinstance(case.expect, Serve) for case in CASES]
    print(f"{len(CASES)} cases: {sum(valid)} valid, {len(CASES) - sum(valid)} invalid\n")
    for name, results in outcomes.items():
        served = sum(ok for ok, (passed, _) in zip(valid, results) if passed)
        refused = sum(not ok for ok, (passed, _) in zip(valid, results) if passed)
        print(f"{name:10} valid served right {served}/{sum(valid)}, "
              f"invalid refused {refused}/{len(CASES) - sum(valid)}")
    print("\nwhere they differ:")
    names = list(SERVERS)
    for i, case in enumerate(CASES):
        results = [outcomes[name][i] for name in names]
        if len({passed for passed, _ in results}) > 1:
            print(f"  {case.section:11} {case.name}: expected {case.expect}; "
                  + "; ".join(f"{name} {happened}" for name, (_, happened) in zip(names, results)))


if __name__ == "__main__":
    main()
