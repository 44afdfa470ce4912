"""Sharding by key: the pure function, the shard files, the CLI and PersonDB's shard mode.

That nginx's split_clients agrees with shard_of() is checked against a real
nginx in test_deploy_nginx.py; the hash values pinned here are the ones it
computes, so a change on another Python version shows up without nginx.
"""

import csv
import json
import os
import subprocess
import sys

import pytest

from forkserve import cli
from forkserve.store import Store, StoreError, main as store_main
from forkserve.store.shards import (
    MAX_SHARDS, ShardError, cumulative_bounds, murmur2, parse_shard, part_widths, shard_of,
    split_clients_block, upper_bounds,
)
from forkserve.store.split import build_csv_shards, shard_path

#: ngx_murmur_hash2 of these bytes (the tail lengths 0-3 and a whole word)
PINNED = {b"": 0, b"a": 2456313694, b"ab": 446775395, b"abc": 324500635,
          b"abcd": 646393889, b"ana@example.com": 3805381067, "é".encode(): 876201565}


def test_murmur2_gives_nginx_values_for_every_tail_length():
    assert {data: murmur2(data) for data in PINNED} == PINNED


def test_bounds_follow_nginx_documented_split_clients_arithmetic():
    # nginx docs: 0.5% -> hashes 0..21474835, then 2% -> 21474836..107374180
    assert cumulative_bounds([50, 200]) == [21474836, 107374181]


def test_shards_have_equal_widths_and_the_last_takes_the_rest():
    assert part_widths(3) == [3333, 3333]
    assert upper_bounds(3) == [1431512599, 2863025198]
    assert part_widths(1) == [] and upper_bounds(1) == []
    assert part_widths(MAX_SHARDS) == [1] * (MAX_SHARDS - 1)


def test_shard_of_places_hash_by_range():
    count = 3
    for data, value in PINNED.items():
        expected = 0 if value < 1431512599 else 1 if value < 2863025198 else 2
        assert shard_of(data, count) == expected


def test_str_and_its_utf8_bytes_are_the_same_key():
    for key in ["ana@example.com", "zoë@example.com", "日本@example.jp"]:
        assert shard_of(key, 7) == shard_of(key.encode(), 7)
    undecodable = b"\xff\xfe@example.com"
    assert shard_of(undecodable.decode("utf-8", "surrogateescape"), 5) == shard_of(undecodable, 5)


def test_keys_spread_evenly_over_shards():
    counts = [0, 0, 0]
    for n in range(30_000):
        counts[shard_of(f"person.n{n:07d}@example.com", 3)] += 1
    assert all(9_000 < count < 11_000 for count in counts), counts


def test_shard_is_the_same_in_other_processes_whatever_the_hash_seed():
    keys = [f"k{n}@example.com" for n in range(200)]
    here = [shard_of(key, 5) for key in keys]
    script = ("import json, sys; from forkserve.store.shards import shard_of; "
              "print(json.dumps([shard_of(k, 5) for k in json.load(sys.stdin)]))")
    for seed in ("0", "12345"):
        out = subprocess.run([sys.executable, "-c", script], input=json.dumps(keys),
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        assert json.loads(out) == here


@pytest.mark.parametrize("bad", [0, -1, MAX_SHARDS + 1, 2.0, "3", True])
def test_impossible_shard_counts_are_refused(bad):
    with pytest.raises(ShardError, match="number of shards"):
        shard_of("a", bad)


def test_a_key_that_is_not_text_or_bytes_is_refused():
    with pytest.raises(ShardError, match="str or bytes, not int"):
        shard_of(42, 3)


def test_parse_shard_reads_i_of_n():
    assert parse_shard("0/3") == (0, 3)
    assert parse_shard(" 2/3 ") == (2, 3)


@pytest.mark.parametrize("text, message", [
    ("3", "is not I/N"), ("a/3", "is not I/N"), ("3/3", "from 0 to 2"), ("-1/3", "from 0 to 2"),
    ("0/0", "between 1 and"),
])
def test_parse_shard_says_what_to_write(text, message):
    with pytest.raises(ShardError, match=message):
        parse_shard(text)


def test_split_clients_block_lists_each_shard_and_ends_with_the_rest():
    assert split_clients_block(3) == (
        'split_clients "$shard_key" $shard {\n'
        "    33.33% shard0;\n"
        "    33.33% shard1;\n"
        "    * shard2;\n"
        "}\n")
    assert "    14.28% s5;\n    * s6;\n" in split_clients_block(7, prefix="s")
    assert split_clients_block(1, "$email", "$to") == 'split_clients "$email" $to {\n    * shard0;\n}\n'


# -- shard files -----------------------------------------------------------------

def _write_people(path, count):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["email", "name"])
        for n in range(count):
            writer.writerow([f"p{n}@example.com", f"Person {n}"])


def test_shard_path_keeps_the_suffix_last():
    assert shard_path("/data/people.store", 1, 3) == "/data/people.shard1-of-3.store"
    assert shard_path("people", 0, 2) == "people.shard0-of-2"


def test_csv_shards_hold_every_record_once_in_its_own_shard(tmp_path):
    source = tmp_path / "people.csv"
    _write_people(source, 500)
    paths = build_csv_shards(source, "email", tmp_path / "people.store", 3)
    assert paths == [str(tmp_path / f"people.shard{i}-of-3.store") for i in range(3)]
    seen = {}
    for index, path in enumerate(paths):
        with Store.open(path) as store:
            for key, value in store.items():
                assert shard_of(key, 3) == index
                seen[key] = value
    assert len(seen) == 500
    assert seen["p7@example.com"] == {"email": "p7@example.com", "name": "Person 7"}


def test_a_duplicate_key_names_its_shard(tmp_path):
    source = tmp_path / "people.csv"
    source.write_text("email,name\na@x,1\nb@x,2\na@x,3\n")
    with pytest.raises(StoreError, match=r"shard \d of 2\): duplicate key 'a@x'"):
        build_csv_shards(source, "email", tmp_path / "people.store", 2)


def test_forkserve_store_build_writes_n_shards_and_shard_names_the_shard(tmp_path, capsys):
    source = tmp_path / "people.csv"
    _write_people(source, 100)
    output = tmp_path / "people.store"
    assert cli.main(["store", "build", str(source), "--key", "email", "-o", str(output),
                     "--shards", "2"]) == 0
    printed = capsys.readouterr().out
    for index in range(2):
        assert f"people.shard{index}-of-2.store: " in printed
    assert cli.main(["store", "shard", "--shards", "2", "p1@example.com", "p2@example.com"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{shard_of(k, 2)}\t{k}" for k in ("p1@example.com", "p2@example.com")]
    assert cli.main(["store", "shard", "--shards", "2", "--nginx"]) == 0
    assert capsys.readouterr().out == split_clients_block(2)


def test_store_cli_errors_say_what_to_do(capsys):
    assert store_main(["shard", "--shards", "3"]) == 1
    assert "give one or more keys" in capsys.readouterr().err
    assert store_main(["shard", "--shards", "0", "k"]) == 1
    assert "between 1 and" in capsys.readouterr().err


def test_python_m_forkserve_store_still_works(tmp_path):
    result = subprocess.run([sys.executable, "-m", "forkserve.store", "shard", "--shards", "3",
                             "ana@example.com"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "2\tana@example.com\n"


# -- PersonDB serving one shard ----------------------------------------------------------

def test_persondb_loads_only_its_shard_in_every_mode(tmp_path):
    from examples.persondb import app, generate
    source = tmp_path / "people.csv"
    generate.generate_file(str(source), 300, 0)
    everyone = app.load_dicts(str(source))
    for mode in ("dict", "store"):
        parts = [app.load(str(source), mode, shard=(index, 3)) for index in range(3)]
        assert sum(len(part) for part in parts) == len(everyone)
        for index, part in enumerate(parts):
            assert all(shard_of(email, 3) == index for email in part)
    assert os.path.exists(f"{source}.shard2-of-3.store")


def test_persondb_answers_421_for_another_shards_email(tmp_path):
    import io
    import wsgiref.util
    from examples.persondb import app
    people = {"mine@example.com": {"email": "mine@example.com"}}
    index = shard_of("mine@example.com", 3)
    served = app.make_app(people, "dict", (index, 3))
    other = next(f"o{n}@example.com" for n in range(100)
                 if shard_of(f"o{n}@example.com", 3) != index)
    unknown = next(f"u{n}@example.com" for n in range(100)
                   if shard_of(f"u{n}@example.com", 3) == index)

    def get(path):
        environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
        wsgiref.util.setup_testing_defaults(environ)
        status = []
        body = b"".join(served(environ, lambda s, h, e=None: status.append(s)))
        return status[0], json.loads(body)

    assert get("/person/mine@example.com")[0] == "200 OK"
    assert get(f"/person/{unknown}")[0] == "404 Not Found"
    status, body = get(f"/person/{other}")
    assert status == "421 Misdirected Request"
    assert body["owner"] == f"{shard_of(other, 3)}/3" and body["shard"] == f"{index}/3"
    assert get("/health")[1]["shard"] == f"{index}/3"


def test_persondb_shard_setting_errors_say_what_to_write():
    from examples.persondb import app
    with pytest.raises(app.PersonDBError, match="PERSONDB_SHARD: shard '3' is not I/N"):
        app.Settings({"PERSONDB_SHARD": "3"})


def test_persondb_serves_a_prebuilt_store_file_without_a_csv(tmp_path):
    from examples.persondb import app
    source = tmp_path / "people.csv"
    _write_people(source, 50)
    [path0, _] = build_csv_shards(source, "email", tmp_path / "people.store", 2)
    settings = app.Settings({"PERSONDB_MODE": "store", "PERSONDB_STORE": path0,
                             "PERSONDB_SHARD": "0/2"})
    assert settings.dataset() is None
    people = app.load(settings.dataset(), settings.mode, settings.store_path, settings.shard)
    assert people.path == path0 and all(shard_of(email, 2) == 0 for email in people)
    with pytest.raises(app.PersonDBError, match="cannot be opened.*forkserve store build"):
        app.load(None, "store", str(tmp_path / "missing.store"))
