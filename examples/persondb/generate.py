"""Generate a synthetic PersonDB: one employee directory row per person, as CSV.

    python -m examples.persondb.generate --rows 300000 -o out/people.csv

Every row is a pure function of ``(seed, index)``: the generator streams rows
to the file one at a time (millions of rows never sit in memory together),
and a load generator can re-derive the email of row N with :func:`email_for`
without reading the CSV. A row is about 1 KB, close to a real directory
entry: names, title, department, company, manager, a list of groups,
location, phones, dates and a few security attributes.

Invariants:

- Emails are unique: each one ends in the row index (``.n0042``), so no two
  rows can collide, whatever names the random draws pick.
- ``email_for(seed, n)`` equals ``person(seed, n)["email"]``.
- The manager of row N (N > 0) is row ``(N - 1) // MANAGER_SPAN``: an
  existing person, so the org chart is a tree rooted at row 0.
- :func:`miss_email` never names a row (its domain is never generated),
  so load tests can ask for unknown people on purpose.
"""

import argparse
import csv
import datetime
import os
import random
import sys

__all__ = [
    "DEFAULT_ROWS",
    "DEFAULT_SEED",
    "FIELDS",
    "email_for",
    "emails",
    "generate_file",
    "main",
    "miss_email",
    "person",
    "write_csv",
    "write_emails",
]

#: Small enough that tests and ``forkserve examples.persondb.app:app`` start
#: in well under a second; benchmarks ask for hundreds of thousands.
DEFAULT_ROWS = 2_000
DEFAULT_SEED = 0

#: Direct reports per manager; 8 gives a realistic, shallow org chart.
MANAGER_SPAN = 8

FIELDS = (
    "email",
    "employee_id",
    "first_name",
    "last_name",
    "display_name",
    "title",
    "department",
    "cost_center",
    "company",
    "domain",
    "manager_email",
    "groups",
    "location",
    "office",
    "phone",
    "mobile",
    "start_date",
    "last_login",
    "mfa_enabled",
    "vip",
    "risk_score",
    "mailbox_quota_mb",
    "aliases",
    "employment_type",
    "timezone",
    "ldap_dn",
    "pgp_fingerprint",
    "photo_url",
    "description",
)

_FIRST = (
    "Ada Alan Alice Amara Ana Andrei Anil Ava Bao Beatriz Ben Bruno Carla "
    "Chen Chiara Chloe Daniel Dara David Diego Elena Eli Emma Farah Felix "
    "Fatima Grace Hana Hugo Ibrahim Ines Ivan Jamal Jana Javier Jin Joao "
    "Julia Kai Kamala Karin Kenji Lara Leila Liam Lina Luca Maya Mateo Mei "
    "Mia Milan Nadia Noah Nora Olga Omar Paula Priya Rafael Ravi Rosa Sam "
    "Sara Sofia Tariq Teresa Tom Uma Victor Wei Yara Yusuf Zoe"
).split()

_LAST = (
    "Abe Adeyemi Alvarez Andersen Bauer Becker Costa Cruz Dubois Eriksson "
    "Fischer Garcia Gomez Hansen Hoffmann Ibrahim Ito Jensen Kaur Khan Kim "
    "Kowalski Kumar Larsen Lee Lopez Martin Meyer Moreau Muller Nakamura "
    "Nguyen Novak Okafor Olsen Park Patel Perez Petrov Rossi Sato Schmidt "
    "Silva Singh Smith Suzuki Tanaka Wagner Wang Weber Wilson Wong Yamamoto "
    "Yilmaz Zhang"
).split()

_DEPARTMENTS = (
    ("Engineering", ("Software Engineer", "Senior Software Engineer",
                     "Staff Engineer", "Engineering Manager", "SRE")),
    ("Security", ("Security Analyst", "Security Engineer", "CISO",
                  "Incident Responder")),
    ("Sales", ("Account Executive", "Sales Engineer", "Sales Director",
               "Business Development Rep")),
    ("Finance", ("Accountant", "Financial Analyst", "Controller", "CFO")),
    ("People", ("Recruiter", "HR Business Partner", "People Ops Lead")),
    ("Support", ("Support Engineer", "Support Lead", "Customer Success Manager")),
    ("Legal", ("Counsel", "Paralegal", "General Counsel")),
    ("Marketing", ("Content Strategist", "Product Marketing Manager",
                   "Designer", "CMO")),
)

_LOCATIONS = (
    ("Amsterdam", "NL", "+31 20", "Europe/Amsterdam"),
    ("Austin", "US", "+1 512", "America/Chicago"),
    ("Bangalore", "IN", "+91 80", "Asia/Kolkata"),
    ("Berlin", "DE", "+49 30", "Europe/Berlin"),
    ("Dublin", "IE", "+353 1", "Europe/Dublin"),
    ("London", "GB", "+44 20", "Europe/London"),
    ("Madrid", "ES", "+34 91", "Europe/Madrid"),
    ("New York", "US", "+1 212", "America/New_York"),
    ("Paris", "FR", "+33 1", "Europe/Paris"),
    ("Sao Paulo", "BR", "+55 11", "America/Sao_Paulo"),
    ("Singapore", "SG", "+65 6", "Asia/Singapore"),
    ("Sydney", "AU", "+61 2", "Australia/Sydney"),
    ("Tokyo", "JP", "+81 3", "Asia/Tokyo"),
    ("Toronto", "CA", "+1 416", "America/Toronto"),
)

_EMPLOYMENT = ("full-time", "full-time", "full-time", "part-time", "contractor", "intern")

_GROUPS = (
    "all-staff all-engineering oncall-primary oncall-secondary vpn-users "
    "github-admins github-users jira-users confluence-editors okta-admins "
    "finance-approvers expense-approvers legal-hold mail-journaling "
    "dlp-exempt quarantine-reviewers phishing-sim-exempt board-reporting "
    "payroll-readers crm-users crm-admins support-tier1 support-tier2 "
    "support-tier3 marketing-publishers press-contacts travel-bookers "
    "security-champions incident-commanders data-warehouse-readers "
    "data-warehouse-writers prod-readonly prod-break-glass laptop-admins"
).split()

#: Number of synthetic companies (tenants); domains are "<name>.example".
_COMPANIES = tuple(
    f"{a}{b}" for a in ("acme", "globex", "initech", "umbrella", "hooli",
                        "stark", "wayne", "wonka", "tyrell", "cyberdyne")
    for b in ("", "-labs", "-group", "-bank", "-health")
)

_EPOCH = datetime.date(2005, 1, 1)
_LOGIN_BASE = datetime.datetime(2024, 6, 1)


def _rng(seed, n):
    # One generator per row keeps every row independent of the others, so a
    # row (or just its email) can be rebuilt from its index alone.
    return random.Random(seed * 0x9E3779B1 + n)


def _identity(rng, n):
    """The draws that make up the email, in a fixed order (see email_for)."""
    first = rng.choice(_FIRST)
    last = rng.choice(_LAST)
    company = rng.choice(_COMPANIES)
    email = f"{first}.{last}.n{n:07d}@{company}.example".lower()
    return first, last, company, email


def email_for(seed, n):
    """The email of row ``n``, without building the rest of the row."""
    return _identity(_rng(seed, n), n)[3]


def emails(seed, rows):
    """Yield the emails of rows ``0 .. rows-1`` in order."""
    for n in range(rows):
        yield email_for(seed, n)


def miss_email(k):
    """An email that no generated row has (for deliberate 404s)."""
    return f"nobody.{k}@unknown.invalid"


def person(seed, n):
    """Row ``n`` of the dataset for ``seed``: a dict of str keyed by FIELDS."""
    rng = _rng(seed, n)
    first, last, company, email = _identity(rng, n)
    department, titles = rng.choice(_DEPARTMENTS)
    title = rng.choice(titles)
    city, country, prefix, timezone = rng.choice(_LOCATIONS)
    groups = rng.sample(_GROUPS, rng.randint(4, 12))
    started = _EPOCH + datetime.timedelta(days=rng.randrange(7000))
    last_login = _LOGIN_BASE + datetime.timedelta(seconds=rng.randrange(86400 * 180))
    manager = "" if n == 0 else email_for(seed, (n - 1) // MANAGER_SPAN)
    aliases = [f"{first[0]}{last}{n}@{company}.example".lower()]
    if rng.random() < 0.3:
        aliases.append(f"{first}{n}@{company}-mail.example".lower())
    return {
        "email": email,
        "employee_id": f"E{n:08d}",
        "first_name": first,
        "last_name": last,
        "display_name": f"{first} {last} ({department}, {city})",
        "title": title,
        "department": department,
        "cost_center": f"CC-{country}-{rng.randrange(100, 999)}",
        "company": company.replace("-", " ").title(),
        "domain": f"{company}.example",
        "manager_email": manager,
        "groups": ";".join(groups),
        "location": f"{city}, {country}",
        "office": f"{city} HQ, floor {rng.randint(1, 30)}, desk {rng.randint(1, 400)}",
        "phone": f"{prefix} {rng.randrange(1000, 9999)} {rng.randrange(1000, 9999)}",
        "mobile": f"{prefix} {rng.randrange(100, 999)} {rng.randrange(100000, 999999)}",
        "start_date": started.isoformat(),
        "last_login": last_login.isoformat() + "Z",
        "mfa_enabled": "true" if rng.random() < 0.93 else "false",
        "vip": "true" if title.startswith("C") and len(title) <= 4 else "false",
        "risk_score": f"{rng.random() * 100:.1f}",
        "mailbox_quota_mb": str(rng.choice((2048, 4096, 51200, 102400))),
        "aliases": ";".join(aliases),
        "employment_type": rng.choice(_EMPLOYMENT),
        "timezone": timezone,
        "ldap_dn": (
            f"CN={first} {last},OU={department},OU={city},OU=People,"
            f"DC={company},DC=example"
        ),
        "pgp_fingerprint": f"{rng.getrandbits(160):040X}",
        "photo_url": f"https://directory.{company}.example/photos/E{n:08d}.jpg",
        "description": (
            f"{title} in {department} at {company.replace('-', ' ').title()}, "
            f"based in {city}. Reports to {manager or 'the board'}. "
            f"Member of {len(groups)} groups; mail routed via "
            f"mx{rng.randint(1, 4)}.{company}.example."
        ),
    }


def write_csv(out, rows, seed=DEFAULT_SEED, progress=None):
    """Write ``rows`` rows to the text stream ``out``, one row at a time.

    ``progress(n)`` is called every 100,000 rows if given.
    """
    writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    for n in range(rows):
        writer.writerow(person(seed, n))
        if progress is not None and n and n % 100_000 == 0:
            progress(n)


def write_emails(out, rows, seed=DEFAULT_SEED):
    """Write the email column only, one per line (input for load generators)."""
    for email in emails(seed, rows):
        out.write(email + "\n")


def generate_file(path, rows, seed=DEFAULT_SEED, progress=None, *, only_emails=False):
    """Write the dataset (or its emails) to ``path`` atomically.

    The rows go to a temporary file beside ``path`` that is renamed into
    place, so a reader, or a second generator racing us, never sees a
    half-written file.
    """
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            if only_emails:
                write_emails(f, rows, seed)
            else:
                write_csv(f, rows, seed, progress)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m examples.persondb.generate",
        description="Write a deterministic synthetic employee directory as CSV.",
    )
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                   help=f"number of people (default {DEFAULT_ROWS})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"random seed; same seed and rows, same file (default {DEFAULT_SEED})")
    p.add_argument("-o", "--output", default="-",
                   help="CSV file to write, '-' for stdout (default)")
    p.add_argument("--emails", action="store_true",
                   help="write only the email column, one per line, no header")
    args = p.parse_args(argv)
    if args.rows < 0:
        p.error("--rows must be >= 0")
    return args


def main(argv=None):
    args = _parse_args(argv)

    def progress(n):
        print(f"generate: {n:,} rows", file=sys.stderr, flush=True)

    if args.output != "-":
        generate_file(args.output, args.rows, args.seed, progress, only_emails=args.emails)
    elif args.emails:
        write_emails(sys.stdout, args.rows, args.seed)
    else:
        write_csv(sys.stdout, args.rows, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
