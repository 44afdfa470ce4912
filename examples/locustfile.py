"""Locust load test for the PersonDB example: random lookups by email.

Against any server already running the app (forkserve, Gunicorn, uWSGI...):

    locust -f examples/locustfile.py --headless -u 50 -r 50 -t 30s \\
        --host http://127.0.0.1:8000

Or let the run start forkserve itself and record its memory next to Locust's
stats (copy-on-write under load, in one command; see forkserve.integrations.locust):

    PERSONDB_CSV=out/people.csv locust -f examples/locustfile.py --headless \\
        -u 50 -r 50 -t 60s --csv out/cow --forkserve-app examples.persondb.app:app

Which emails exist (the list is never fetched from the server):

- ``PERSONDB_CSV`` set: the email column of that CSV, the file the server
  loads;
- otherwise the generator's deterministic scheme for ``PERSONDB_ROWS`` rows
  (default 2,000) and ``PERSONDB_SEED`` (default 0), the same defaults the
  app uses when it generates its demo dataset.

Traffic mix per user: ~94% lookups of random existing people, ~5% lookups
of unknown people (a 404 is the right answer, so it counts as a success and
anything else as a failure), ~1% ``/health``. Users send requests back to
back (no think time): ``-u`` is the number of concurrent connections.
Locust spends tens of microseconds of Python per request, so on a small
machine it competes with the server for CPU; for throughput numbers use
benchmarks/run.py (wrk), for behaviour and memory over time use this.
"""

import csv
import itertools
import os
import random
import sys

from locust import FastHttpUser, constant, task

try:
    from examples.persondb import generate
except ImportError:
    # `locust -f examples/locustfile.py` puts examples/ on sys.path, not the
    # repository root.
    from persondb import generate

# Registers --forkserve-app / --forkserve-stats and the memory sampler.
import forkserve.integrations.locust  # noqa: F401,E402


def load_emails(environ=os.environ):
    """The emails of the people the server knows (see the module docstring)."""
    path = environ.get("PERSONDB_CSV")
    if path:
        try:
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                header = next(reader, [])
                if "email" not in header:
                    sys.exit(f"locustfile: {path} has no 'email' column; is it a PersonDB CSV?")
                column = header.index("email")
                return [row[column] for row in reader if len(row) > column]
        except FileNotFoundError:
            sys.exit(f"locustfile: PERSONDB_CSV={path} does not exist")
    rows = int(environ.get("PERSONDB_ROWS") or generate.DEFAULT_ROWS)
    seed = int(environ.get("PERSONDB_SEED") or generate.DEFAULT_SEED)
    return list(generate.emails(seed, rows))


EMAILS = load_emails()
_misses = itertools.count()


class PersonDBUser(FastHttpUser):
    wait_time = constant(0)

    @task(94)
    def lookup(self):
        email = random.choice(EMAILS)
        with self.client.get(f"/person/{email}", name="/person/[known]",
                             catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"known person answered {response.status_code}")

    @task(5)
    def lookup_unknown(self):
        email = generate.miss_email(next(_misses))
        with self.client.get(f"/person/{email}", name="/person/[unknown]",
                             catch_response=True) as response:
            if response.status_code == 404:
                response.success()
            else:
                response.failure(f"unknown person answered {response.status_code}, not 404")

    @task(1)
    def health(self):
        self.client.get("/health")
