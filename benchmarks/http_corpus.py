"""Run the RFC 9110/9112 request corpus (tests/rfc_corpus.py) against forkserve
and Gunicorn (gevent worker) side by side, and count what each got right.

    python benchmarks/http_corpus.py            # needs gunicorn (pip install -e '.[bench]')

Both servers run tests/apps/echo_environ.py with the same --limit-request-*
numbers (rfc_corpus.CORPUS_LIMITS). A valid case counts as right when it is
served with the environ the RFCs imply; an invalid case when it is refused
(any 4xx/5xx or a close without a response; the status forkserve gives is in
the corpus and shown). Cases where the two servers differ are listed, and
the counts written to result.json (the harness's schema) in --out.
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
sys.path[:0] = [str(TESTS), str(ROOT)]

from rfc_corpus import CASES, CORPUS_LIMITS, Serve, exchange, verdict  # noqa: E402

from benchmarks.harness.machine import Conditions, versions  # noqa: E402
from benchmarks.harness.results import write_result  # noqa: E402
from benchmarks.harness.start import start as start_server  # noqa: E402

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("server", "server"), ("valid_served_right", "valid cases served right"),
    ("valid", "valid cases"), ("invalid_refused", "invalid cases refused"),
    ("invalid", "invalid cases"),
)

SERVERS = {
    "forkserve": ["-m", "forkserve", "-w", "1", "-b", "127.0.0.1:0"],
    "gunicorn": ["-m", "gunicorn", "-k", "gevent", "-w", "1", "-b", "127.0.0.1:0"],
}


def start(name, log_path, python=sys.executable):
    limits = [arg for key, value in CORPUS_LIMITS.items() for arg in (f"--{key}", str(value))]
    return start_server([python] + SERVERS[name] + limits + ["echo_environ:app"],
                        log_path=log_path,
                        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=TESTS / "apps",
                        processes=2, probe_path="/")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "http_corpus"),
                        help="where result.json goes (%(default)s)")
    parser.add_argument("--python", default=sys.executable,
                        help="the servers' interpreter, with forkserve and gunicorn installed "
                             "(default: this one)")
    parser.add_argument("--quick", action="store_true",
                        help="the same run: the corpus takes seconds")
    args = parser.parse_args(argv)
    conditions, rows = Conditions(), []
    outcomes = {}
    for name in SERVERS:
        with start(name, f"/tmp/http-corpus-{name}.log", args.python) as server:
            outcomes[name] = [verdict(case, *exchange(server.port, case.raw), exact=False)
                              for case in CASES]
    valid = [isinstance(case.expect, Serve) for case in CASES]
    print(f"{len(CASES)} cases: {sum(valid)} valid, {len(CASES) - sum(valid)} invalid\n")
    for name, results in outcomes.items():
        served = sum(ok for ok, (passed, _) in zip(valid, results) if passed)
        refused = sum(not ok for ok, (passed, _) in zip(valid, results) if passed)
        print(f"{name:10} valid served right {served}/{sum(valid)}, "
              f"invalid refused {refused}/{len(CASES) - sum(valid)}")
        rows.append({"server": name, "valid_served_right": served, "valid": sum(valid),
                     "invalid_refused": refused, "invalid": len(CASES) - sum(valid)})
    print("\nwhere they differ:")
    names, differ = list(SERVERS), 0
    for i, case in enumerate(CASES):
        results = [outcomes[name][i] for name in names]
        if len({passed for passed, _ in results}) > 1:
            differ += 1
            print(f"  {case.section:11} {case.name}: expected {case.expect}; "
                  + "; ".join(f"{name} {happened}" for name, (_, happened) in zip(names, results)))

    write_result("http_corpus.py", argv, rows, conditions, args.out,
                 title="the RFC request corpus, side by side", versions=versions(args.python),
                 note=f"{differ} of {len(CASES)} cases differ between the servers; the "
                 "command lists them.")


if __name__ == "__main__":
    main()
