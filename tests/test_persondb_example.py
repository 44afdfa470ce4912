"""The PersonDB example: its generator and its Bottle app, called directly.

No server runs here: requests go straight to the WSGI callable through
wsgiref's validator. Modes that change the process (share) or need the
module's import-time loading run in a subprocess.
"""

import csv
import io
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from wsgiref.util import setup_testing_defaults
from wsgiref.validate import validator

import pytest

from examples.persondb import generate

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytest.importorskip("bottle")
from examples.persondb import app as persondb  # noqa: E402


def call(app, path, method="GET"):
    """Run one request through the validated app: (status int, headers, body)."""
    environ = {"PATH_INFO": path, "SCRIPT_NAME": "", "REQUEST_METHOD": method, "QUERY_STRING": ""}
    setup_testing_defaults(environ)
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, dict(headers)
        return lambda data: None

    result = validator(app)(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        result.close()
    return int(seen["status"].split()[0]), seen["headers"], body


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("persondb") / "people.csv"
    generate.generate_file(str(path), 300, seed=7)
    return str(path)


@pytest.fixture(scope="module")
def rows(dataset):
    with open(dataset, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# -- the generator ---------------------------------------------------------------


def test_same_seed_and_index_give_the_same_row():
    assert generate.person(3, 41) == generate.person(3, 41)
    assert generate.person(3, 41) != generate.person(4, 41)


def test_email_for_matches_the_row_without_building_it():
    for n in (0, 1, 17, 999, 123_456):
        assert generate.email_for(5, n) == generate.person(5, n)["email"]


def test_emails_are_unique():
    emails = list(generate.emails(0, 20_000))
    assert len(set(emails)) == len(emails)


def test_every_manager_is_an_earlier_person():
    for n in range(1, 500):
        manager = generate.person(0, n)["manager_email"]
        m = (n - 1) // generate.MANAGER_SPAN
        assert m < n and manager == generate.email_for(0, m)
    assert generate.person(0, 0)["manager_email"] == ""


def test_miss_emails_never_name_a_person():
    domains = {e.split("@")[1] for e in generate.emails(0, 2_000)}
    assert generate.miss_email(12).split("@")[1] not in domains


def test_rows_are_about_a_kilobyte(rows):
    out = io.StringIO()
    generate.write_csv(out, 200, seed=1)
    lines = out.getvalue().splitlines()
    mean = sum(len(line) for line in lines[1:]) / 200
    assert 700 < mean < 1500


def test_csv_has_every_field_and_groups_as_a_list(rows):
    assert len(rows) == 300
    assert list(rows[0]) == list(generate.FIELDS)
    assert all(len(r["groups"].split(";")) >= 4 for r in rows)


def test_cli_writes_csv_and_emails_deterministically(tmp_path):
    a, b, e = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "e.txt"
    assert generate.main(["--rows", "50", "--seed", "9", "-o", str(a)]) == 0
    assert generate.main(["--rows", "50", "--seed", "9", "-o", str(b)]) == 0
    assert generate.main(["--rows", "50", "--seed", "9", "--emails", "-o", str(e)]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert e.read_text().split() == list(generate.emails(9, 50))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.csv", "e.txt"]  # no temp files


def test_cli_rejects_negative_rows(capsys):
    with pytest.raises(SystemExit):
        generate.main(["--rows", "-1"])
    assert "--rows must be >= 0" in capsys.readouterr().err


# -- the app -----------------------------------------------------------------------


def test_known_person_is_served_as_their_row(dataset, rows):
    app = persondb.make_app(persondb.load(dataset, "dict"), "dict")
    status, headers, body = call(app, "/person/" + rows[42]["email"])
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(body) == rows[42]


def test_unknown_person_is_a_404_json(dataset):
    app = persondb.make_app(persondb.load(dataset, "dict"), "dict")
    status, headers, body = call(app, "/person/" + generate.miss_email(1))
    assert status == 404
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(body) == {"error": "not found", "email": generate.miss_email(1)}


def test_health_reports_rows_and_mode(dataset):
    app = persondb.make_app(persondb.load(dataset, "dict"), "dict")
    status, _, body = call(app, "/health")
    health = json.loads(body)
    assert status == 200
    assert (health["status"], health["rows"], health["mode"]) == ("ok", 300, "dict")
    assert health["pid"] == os.getpid()


def test_unknown_route_is_a_404_json(dataset):
    app = persondb.make_app(persondb.load(dataset, "dict"), "dict")
    status, headers, body = call(app, "/nope")
    assert status == 404
    assert json.loads(body)["path"] == "/nope"


def test_store_mode_serves_the_same_people(dataset, rows, tmp_path):
    pytest.importorskip("forkserve.store")
    store_path = str(tmp_path / "people.store")
    people = persondb.load(dataset, "store", store_path)
    app = persondb.make_app(people, "store")
    for row in rows[::37]:
        status, _, body = call(app, "/person/" + row["email"])
        assert status == 200 and json.loads(body) == row
    assert call(app, "/person/" + generate.miss_email(3))[0] == 404
    assert json.loads(call(app, "/health")[2])["rows"] == 300
    assert sorted(os.listdir(tmp_path)) == ["people.store"]  # built in place, no temp left


def test_store_cache_is_reused_until_the_csv_changes(dataset, tmp_path):
    pytest.importorskip("forkserve.store")
    store_path = tmp_path / "people.store"
    persondb.load_store(dataset, str(store_path))
    built = store_path.stat().st_mtime_ns
    persondb.load_store(dataset, str(store_path))
    assert store_path.stat().st_mtime_ns == built
    os.utime(dataset, ns=(built + 10**9, built + 10**9))
    persondb.load_store(dataset, str(store_path))
    assert store_path.stat().st_mtime_ns != built


def test_missing_csv_error_names_the_file_and_the_fix(tmp_path):
    missing = str(tmp_path / "nope.csv")
    with pytest.raises(persondb.PersonDBError) as info:
        persondb.load(missing, "dict")
    assert missing in str(info.value)
    assert "python -m examples.persondb.generate" in str(info.value)


@pytest.mark.parametrize("content, expected", [
    ("", "it is empty"),
    ("name,title\nAda,CTO\n", "no 'email' column"),
])
def test_csv_without_emails_is_refused(tmp_path, content, expected):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(persondb.PersonDBError, match=expected):
        persondb.load(str(path), "dict")


def test_bad_settings_are_refused():
    with pytest.raises(persondb.PersonDBError, match="PERSONDB_MODE='lists' is not one of"):
        persondb.Settings({"PERSONDB_MODE": "lists"})
    with pytest.raises(persondb.PersonDBError, match="PERSONDB_ROWS='many' is not an integer"):
        persondb.Settings({"PERSONDB_ROWS": "many"})


# -- import-time loading, in a fresh interpreter -------------------------------------

_PROBE = textwrap.dedent("""
    import json, sys
    from wsgiref.util import setup_testing_defaults
    from examples.persondb import generate
    from examples.persondb.app import app

    def get(path):
        env = {"PATH_INFO": path}
        setup_testing_defaults(env)
        out = {}
        body = b"".join(app(env, lambda s, h, e=None: out.setdefault("s", s)))
        return int(out["s"].split()[0]), json.loads(body)

    print(json.dumps({"health": get("/health")[1],
                      "first": get("/person/" + generate.email_for(int(sys.argv[1]), 0))}))
""")


def _probe(env, seed=0):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PERSONDB_")}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(seed)],
        cwd=ROOT, env={**clean, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_app_works_with_no_settings(tmp_path):
    result, log = _probe({"TMPDIR": str(tmp_path), "PERSONDB_ROWS": "120", "PERSONDB_SEED": "4"}, 4)
    assert result["health"]["rows"] == 120 and result["health"]["mode"] == "dict"
    assert result["first"][0] == 200
    assert "loaded 120 people" in log


def test_share_mode_loads_shares_and_serves(dataset):
    pytest.importorskip("forkserve.memory.sharing")
    result, log = _probe({"PERSONDB_CSV": dataset, "PERSONDB_MODE": "share"}, 7)
    assert result["health"]["mode"] == "share" and result["health"]["rows"] == 300
    assert result["first"][0] == 200
    assert "forkserve.share:" in log


def test_bad_csv_fails_the_import_with_the_reason(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PERSONDB_")}
    missing = str(tmp_path / "absent.csv")
    proc = subprocess.run(
        [sys.executable, "-c", "import examples.persondb.app"], cwd=ROOT,
        env={**clean, "PERSONDB_CSV": missing, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert f"PersonDB CSV '{missing}' does not exist" in proc.stderr


def test_store_cache_in_an_unreadable_format_is_rebuilt(dataset, tmp_path, caplog):
    pytest.importorskip("forkserve.store")
    from forkserve.store import layout

    store_path = tmp_path / "people.store"
    store_path.write_bytes(layout.MAGIC + (1).to_bytes(4, "little") + bytes(80))
    os.utime(store_path, ns=(2 * 10**18, 2 * 10**18))  # newer than the CSV
    with caplog.at_level("WARNING", logger="persondb"):
        people = persondb.load_store(dataset, str(store_path))
    assert len(people) == 300
    assert any("format version 1" in message for message in caplog.messages)
