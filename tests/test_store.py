"""forkserve.store: a read-only mapping packed in one buffer.

Unit tests build small stores in memory and in tmp_path. The memory tests
run a script in a fresh interpreter (never forking pytest itself): it builds
a store of PersonDB-like records, forks a child that looks up every record,
and reports the child's private memory from /proc/self/smaps_rollup.
"""

import collections.abc
import csv
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forkserve.store import csvrows, layout
from forkserve.store import Store, StoreError, StoreFormatError

ROOT = Path(__file__).resolve().parent.parent

PEOPLE = {
    "ana@example.com": {"email": "ana@example.com", "name": "Ana Souza", "team": "Security"},
    "bo@example.com": {"email": "bo@example.com", "name": "Bo Lindqvist", "team": "Finance"},
    "chen@example.com": {"email": "chen@example.com", "name": "陈静", "team": "Engineering"},
}


@pytest.fixture(params=["in memory", "from file"])
def make_store(request, tmp_path):
    """Build a store in memory, or write it to a file and open that."""
    stores = []

    def make(rows, codec="json"):
        if request.param == "in memory":
            store = Store.build(rows, codec=codec)
        else:
            Store.build(rows, tmp_path / "built.fsdb", codec=codec).close()
            store = Store.open(tmp_path / "built.fsdb")
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def write_csv(path, text):
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# -- values, codecs, keys ---------------------------------------------------

def test_json_records_round_trip(make_store):
    store = make_store(PEOPLE.items())
    assert dict(store) == PEOPLE
    assert store.codec == "json"


@pytest.mark.parametrize("codec, values", [
    ("json", [{"a": [1, 2.5, None, True]}, "text", 7, [], {}]),
    ("bytes", [b"", b"\x00\xff raw", bytearray(b"mutable"), memoryview(b"view")]),
    ("str", ["", "plain", "ünïcødé ✓", "line\nbreak"]),
])
def test_each_codec_round_trips_its_values(make_store, codec, values):
    store = make_store([(f"k{i}", value) for i, value in enumerate(values)], codec=codec)
    assert store.codec == codec
    for i, value in enumerate(values):
        assert store[f"k{i}"] == value
        if codec == "bytes":
            assert type(store[f"k{i}"]) is bytes


def test_msgpack_codec_round_trips_when_installed():
    pytest.importorskip("msgpack")
    with Store.build({"k": {"a": [1, b"bin"]}}, codec="msgpack") as store:
        assert store["k"] == {"a": [1, b"bin"]}


def test_msgpack_codec_without_the_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "msgpack", None)  # makes `import msgpack` fail
    with pytest.raises(StoreError, match="pip install msgpack"):
        Store.build({"k": 1}, codec="msgpack")


def test_unknown_codec_names_the_known_ones():
    known = "bytes, json, msgpack, row, str"
    with pytest.raises(StoreError, match=f"unknown codec 'yaml'; use one of: {known}"):
        Store.build({}, codec="yaml")


def test_raw_returns_the_stored_json_bytes(make_store):
    store = make_store(PEOPLE.items())
    assert store.raw("ana@example.com") == orjson.dumps(PEOPLE["ana@example.com"])
    assert store.get_raw("chen@example.com") == orjson.dumps(PEOPLE["chen@example.com"])
    assert type(store.raw("ana@example.com")) is bytes


def test_each_lookup_returns_a_fresh_value(make_store):
    store = make_store(PEOPLE.items())
    store["ana@example.com"]["team"] = "changed"
    assert store["ana@example.com"]["team"] == "Security"


def test_str_and_bytes_keys_find_the_same_record(make_store):
    store = make_store([("zoë", 1), (b"bytes-key", 2)])
    assert store["zoë"] == store["zoë".encode()] == 1
    assert store["bytes-key"] == store[b"bytes-key"] == 2
    assert "zoë".encode() in store and "bytes-key" in store


def test_unicode_keys_round_trip(make_store):
    keys = ["é", "e\u0301", "日本語", "🙂 emoji", "\u0000nul", "ß", "Ǆ", "a" * 10_000]
    store = make_store([(key, i) for i, key in enumerate(keys)])
    assert list(store) == keys
    # "é" and "e\u0301" stay two keys: keys are bytes, never normalized.
    assert [store[key] for key in keys] == list(range(len(keys)))


def test_non_utf8_bytes_keys_iterate_as_surrogate_escapes_that_look_themselves_up(make_store):
    store = make_store([(b"\xff\xfe", "binary")])
    [key] = list(store)
    assert key == "\udcff\udcfe"
    assert store[key] == store[b"\xff\xfe"] == "binary"


@pytest.mark.parametrize("length", [0, 127, 128, 16_383, 16_384, 2_100_000])
def test_keys_and_values_of_every_length_class_round_trip(make_store, length):
    # Lengths are varints: 1 byte below 128, 2 below 16 KiB, 3 and more above.
    key, value = "k" * max(length, 1), "v" * length
    store = make_store([(key, value), ("short", "x")], codec="str")
    assert store[key] == value and store["short"] == "x"
    assert list(store) == [key, "short"]


def test_keys_of_other_types_are_simply_absent(make_store):
    store = make_store([("1", "one")])
    assert 1 not in store
    assert store.get(1) is None
    assert "\ud800" not in store  # a lone surrogate cannot be a stored key
    with pytest.raises(KeyError):
        store[1]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (st.lists(children, max_size=4)
                      | st.dictionaries(st.text(), children, max_size=4)),
    max_leaves=8,
)


# -- codec "row": field names once ----------------------------------------------

ROWS = {
    "ana@x": {"email": "ana@x", "name": "Ana", "note": ""},
    "quote@x": {"email": "quote@x", "name": 'Say "hi"\\ \n\t\x00', "note": "50%"},
    "zoë@x": {"email": "zoë@x", "name": "陈静 🙂", "note": "Ωmega"},
    "typed@x": {"email": "typed@x", "name": 7, "note": [1.5, None, True, {"k": "v"}]},
    "moved@x": {"email": "elsewhere@x", "name": "key field differs", "note": "x"},
    "qu\"oted@x": {"email": 'qu"oted@x', "name": "a key that needs escaping", "note": "y"},
}


def test_row_records_round_trip_and_raw_is_exactly_orjsons_json(make_store):
    store = make_store(ROWS.items(), codec="row")
    assert store.codec == "row" and store.fields == ("email", "name", "note")
    assert dict(store) == ROWS and list(store) == list(ROWS)
    for key, value in ROWS.items():
        assert store[key] == value
        assert store.raw(key) == orjson.dumps(value), key
        assert type(store.raw(key)) is bytes


def test_row_field_names_are_stored_once_not_per_record():
    rows = [(f"user{i}", {"id": f"user{i}", "a_long_field_name": "v", "another_long_one": "w"})
            for i in range(100)]
    with Store.build(rows, codec="row") as store:
        image = bytes(store._buf)
    assert image.count(b"a_long_field_name") == image.count(b"another_long_one") == 1
    assert image.count(b"user42") == 1  # the key column is not stored twice


@pytest.mark.parametrize("fields, key_value", [
    ({}, None),
    ({"only": "k"}, "k"),
    ({"only": "not the key"}, None),
    ({"a%s": "x", "b%%": "k", "c": "%s%d"}, "k"),
])
def test_row_schemas_of_every_size_round_trip(make_store, fields, key_value):
    store = make_store([("k", fields), ("k2", {**fields})], codec="row")
    assert store["k"] == store["k2"] == fields
    assert store.raw("k") == orjson.dumps(fields)


def test_row_values_of_another_shape_are_refused_with_advice():
    base = {"email": "a", "name": "A"}
    with pytest.raises(StoreError, match="record 2, key 'b': codec 'row' cannot encode the value: "
                                         "it has no field 'name', which the first row has; "
                                         "use codec 'json'"):
        Store.build([("a", base), ("b", {"email": "b"})], codec="row")
    with pytest.raises(StoreError, match="it has fields the first row has not: 'extra'"):
        Store.build([("a", base), ("b", {**base, "extra": 1})], codec="row")
    with pytest.raises(StoreError, match="codec 'row' needs a mapping of field names to values, "
                                         "not int"):
        Store.build([("a", 1)], codec="row")


def test_damaged_row_record_is_reported_when_read(tmp_path):
    path = tmp_path / "rows.fsdb"
    Store.build({"a": {"k": "a", "x": "1", "y": "2"}, "b": {"k": "b", "x": "3", "y": "4"}},
                path, codec="row").close()
    data = bytearray(path.read_bytes())
    separator = data.index(b"1\x1f2")
    data[separator + 1] = ord("-")  # one field where two belong
    path.write_bytes(data)
    with Store.open(path) as store:
        with pytest.raises(StoreFormatError, match="value of 'a' does not decode as row .1 fields "
                                                   "where the record should hold 2"):
            store["a"]
        with pytest.raises(StoreFormatError, match="value of 'a' does not decode as row"):
            store.raw("a")
        assert store["b"] == {"k": "b", "x": "3", "y": "4"}


def test_damaged_field_names_are_refused_on_open(tmp_path):
    path = tmp_path / "rows.fsdb"
    Store.build({"a": {"k": "a", "field": "1"}}, path, codec="row").close()
    data = path.read_bytes().replace(b'"field"', b'"fiELd"')
    path.write_bytes(data)
    with pytest.raises(StoreFormatError, match="schema is damaged .checksum mismatch.; rebuild"):
        Store.open(path)


def test_stores_whose_records_end_past_4_gib_use_uint64_positions(monkeypatch, tmp_path):
    # Writing 4 GiB is too slow for a unit test: make the builder and the
    # reader take every store for a big one.
    from forkserve.store import build
    monkeypatch.setattr(build, "positions_are_wide", lambda data_end: True)
    monkeypatch.setattr(layout, "positions_are_wide", lambda data_end: True)
    with Store.build(ROWS, tmp_path / "wide.fsdb", codec="row") as store:
        assert store._layout.wide and store._positions.format == "Q"
        assert dict(store) == ROWS
        store.verify()


@settings(max_examples=75, deadline=None, database=None)
@given(st.lists(st.text(max_size=8), min_size=1, max_size=6, unique=True),
       st.lists(st.lists(json_values, min_size=6, max_size=6), max_size=20))
def test_any_table_of_json_values_round_trips_as_rows_and_as_json(names, table):
    rows = {}
    for i, values in enumerate(table):
        row = dict(zip(names, values))
        key = f"r{i}"
        if i % 2:  # half the rows have their key in the first field, as a CSV's key column
            row[names[0]] = key
        rows[key] = row
    with Store.build(rows, codec="row") as store:
        assert list(store.items()) == list(rows.items())
        assert all(store.raw(key) == orjson.dumps(row) for key, row in rows.items())


# -- mapping behaviour --------------------------------------------------------

def test_store_behaves_as_a_read_only_mapping(make_store):
    store = make_store(PEOPLE.items())
    assert isinstance(store, collections.abc.Mapping)
    assert not isinstance(store, collections.abc.MutableMapping)
    assert len(store) == 3
    assert store == PEOPLE
    assert list(store.keys()) == list(PEOPLE)
    assert list(store.items()) == list(PEOPLE.items())
    assert list(store.values()) == list(PEOPLE.values())
    assert ("ana@example.com", PEOPLE["ana@example.com"]) in store.items()
    assert store.keys() & {"bo@example.com", "nobody"} == {"bo@example.com"}
    with pytest.raises(TypeError):
        store["new"] = 1


def test_missing_key_raises_key_error_naming_it(make_store):
    store = make_store(PEOPLE.items())
    with pytest.raises(KeyError, match="nobody@example.com"):
        store["nobody@example.com"]
    with pytest.raises(KeyError):
        store.raw(b"nobody@example.com")
    assert "nobody@example.com" not in store
    assert store.get("nobody@example.com") is None
    assert store.get("nobody@example.com", "default") == "default"
    assert store.get_raw("nobody@example.com", b"-") == b"-"


def test_iteration_yields_str_keys_in_the_order_given(make_store):
    keys = [f"key-{i * 7919 % 1000}" for i in range(1000)]
    store = make_store((key, i) for i, key in enumerate(keys))
    assert list(store) == keys
    assert all(type(key) is str for key in store)


def test_a_store_of_many_records_finds_every_one_and_no_others(make_store):
    store = make_store((f"user{i}", i) for i in range(20_000))
    assert all(store[f"user{i}"] == i for i in range(20_000))
    assert not any(f"user{i}" in store for i in range(20_000, 25_000))


def test_empty_store_has_no_keys(make_store):
    store = make_store([])
    assert len(store) == 0
    assert list(store) == [] and dict(store.items()) == {}
    assert store.get("anything") is None
    assert store.nbytes > 0


def test_build_accepts_a_mapping_and_any_iterable_of_pairs():
    with Store.build(PEOPLE) as from_mapping, Store.build(iter(PEOPLE.items())) as from_pairs:
        assert from_mapping == from_pairs == PEOPLE


def test_build_streams_its_rows_one_at_a_time():
    consumed = []

    def rows():
        for i in range(5):
            consumed.append(i)
            yield f"k{i}", i

    with Store.build(rows()) as store:
        assert consumed == list(range(5)) and len(store) == 5


# -- files ------------------------------------------------------------------------

def test_save_then_open_gives_the_same_store(tmp_path):
    with Store.build(PEOPLE) as built:
        built.save(tmp_path / "saved.fsdb")
        with Store.open(tmp_path / "saved.fsdb") as opened:
            assert opened == built
            assert opened.nbytes == built.nbytes == (tmp_path / "saved.fsdb").stat().st_size
            assert opened.path == str(tmp_path / "saved.fsdb") and built.path is None
            opened.verify()


def test_build_to_a_path_writes_the_file_and_leaves_no_temporary(tmp_path):
    with Store.build(PEOPLE, tmp_path / "people.fsdb") as store:
        assert store.path == str(tmp_path / "people.fsdb")
        assert store == PEOPLE
    assert [p.name for p in tmp_path.iterdir()] == ["people.fsdb"]
    assert (tmp_path / "people.fsdb").stat().st_mode & 0o777 == 0o644


def test_failed_build_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    Store.build({"old": 1}, tmp_path / "data.fsdb").close()

    def rows():
        yield "new", 1
        raise RuntimeError("source went away")

    with pytest.raises(RuntimeError, match="source went away"):
        Store.build(rows(), tmp_path / "data.fsdb")
    assert [p.name for p in tmp_path.iterdir()] == ["data.fsdb"]
    with Store.open(tmp_path / "data.fsdb") as store:
        assert dict(store) == {"old": 1}


def test_rebuilding_over_an_open_store_leaves_the_open_one_readable(tmp_path):
    path = tmp_path / "data.fsdb"
    with Store.build({"k": "old"}, path) as old:
        mapped = path.stat().st_ino
        with Store.build({"k": "new"}, path) as new:
            assert old["k"] == "old" and new["k"] == "new"
            # A new inode: the pages other processes map are never rewritten.
            assert path.stat().st_ino != mapped
            new.save(path)
            assert old["k"] == "old" and new["k"] == "new"


@pytest.fixture
def store_file(tmp_path):
    path = tmp_path / "people.fsdb"
    Store.build(PEOPLE, path).close()
    return path


@pytest.mark.parametrize("keep", [0, 7, layout.HEADER.size, -100, -1])
def test_truncated_file_is_refused_with_advice_to_rebuild(store_file, keep):
    data = store_file.read_bytes()
    store_file.write_bytes(data[:keep % len(data)])
    with pytest.raises(StoreFormatError, match=r"rebuild it from its source: python -m forkserve.store build") as caught:
        Store.open(store_file)
    assert str(store_file) in str(caught.value)
    if keep < 0:
        assert f"truncated: the header says {len(data)} bytes" in str(caught.value)


@pytest.mark.parametrize("content", [
    b"email,name\nana@example.com,Ana\n" * 10,
    b"\x89PNG\r\n\x1a\n" + bytes(200),
    b"SQLite format 3\x00" + bytes(200),
])
def test_foreign_file_is_refused(tmp_path, content):
    path = write_csv(tmp_path / "foreign.fsdb", content)
    with pytest.raises(StoreFormatError, match="not a forkserve store.*rebuild it from its source"):
        Store.open(path)


def test_trailing_data_is_refused(store_file):
    store_file.write_bytes(store_file.read_bytes() + b"extra")
    with pytest.raises(StoreFormatError, match="5 bytes of trailing data"):
        Store.open(store_file)


def test_damaged_header_is_refused(store_file):
    data = bytearray(store_file.read_bytes())
    data[40] ^= 0x01  # inside the record count
    store_file.write_bytes(data)
    with pytest.raises(StoreFormatError, match="header is damaged"):
        Store.open(store_file)


def test_damaged_trailer_is_refused(store_file):
    data = bytearray(store_file.read_bytes())
    data[-10] ^= 0x01
    store_file.write_bytes(data)
    with pytest.raises(StoreFormatError, match="trailer"):
        Store.open(store_file)


def set_version(path, version):
    data = bytearray(path.read_bytes())
    data[8:12] = version.to_bytes(4, "little")
    span = layout.HEADER.size - 4
    data[span:span + 4] = zlib.crc32(data[:span]).to_bytes(4, "little")
    path.write_bytes(data)


def test_newer_format_version_is_refused(store_file):
    set_version(store_file, 3)
    with pytest.raises(StoreFormatError, match="version 3, written by a newer forkserve; this "
                                               "forkserve reads version 2: upgrade forkserve"):
        Store.open(store_file)


def test_version_1_file_is_refused_with_the_command_that_rebuilds_it(tmp_path):
    # The first 92 bytes of a version-1 store as forkserve 7a4faab wrote it.
    old = tmp_path / "people.fsdb"
    old.write_bytes(layout.MAGIC + (1).to_bytes(4, "little") + bytes(80))
    with pytest.raises(StoreFormatError) as caught:
        Store.open(old)
    message = str(caught.value)
    assert message.startswith(f"{old}: format version 1, written by an older forkserve; "
                              f"this forkserve reads version 2 only")
    assert "python -m forkserve.store build DATA.csv --key COLUMN -o NEW.fsdb" in message


def test_verify_finds_a_damaged_record_that_open_does_not_read(store_file):
    data = bytearray(store_file.read_bytes())
    data[layout.HEADER.size + 3] ^= 0x20
    store_file.write_bytes(data)
    with Store.open(store_file) as store:
        with pytest.raises(StoreFormatError, match="records are damaged"):
            store.verify()


def test_damaged_value_is_reported_when_read_not_returned_as_garbage(store_file):
    data = bytearray(store_file.read_bytes())
    value_start = layout.HEADER.size + 1 + len("ana@example.com") + 1
    assert data[value_start:value_start + 1] == b"{"
    data[value_start] = ord("}")
    store_file.write_bytes(data)
    with Store.open(store_file) as store:
        with pytest.raises(StoreFormatError, match="'ana@example.com' does not decode as json"):
            store["ana@example.com"]
        assert store["bo@example.com"] == PEOPLE["bo@example.com"]


def test_closed_store_refuses_lookups_and_closing_twice_is_harmless():
    store = Store.build(PEOPLE)
    with store:
        pass
    store.close()
    assert "closed" in repr(store)
    with pytest.raises(ValueError):
        store["ana@example.com"]


# -- bad rows -------------------------------------------------------------------

def test_duplicate_key_names_the_key_and_both_records():
    with pytest.raises(StoreError, match="duplicate key 'b': record 2 and record 4; keys must be"):
        Store.build([("a", 1), ("b", 2), ("c", 3), (b"b", 4)])


def test_duplicate_key_building_a_file_leaves_nothing_behind(tmp_path):
    with pytest.raises(StoreError, match="duplicate key 'a'"):
        Store.build([("a", 1), ("a", 2)], tmp_path / "dup.fsdb")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("codec, value, problem", [
    ("json", object(), "Type is not JSON serializable: object"),
    ("json", 2**70, "Integer exceeds 64-bit range"),
    ("bytes", "text", "expected bytes, not str"),
    ("str", 5, "expected str, not int"),
    ("str", "\ud800", "'utf-8' codec can't encode character '.ud800' in position 0"),
])
def test_value_the_codec_cannot_encode_names_the_record(codec, value, problem):
    rows = [("fine", b"x" if codec == "bytes" else "x"), ("bad", value)]
    expected = f"record 2, key 'bad': codec '{codec}' cannot encode the value: {problem}"
    with pytest.raises(StoreError, match=expected):
        Store.build(rows, codec=codec)


def test_key_of_the_wrong_type_names_the_record():
    with pytest.raises(StoreError, match="record 2: a key must be str or bytes, not int"):
        Store.build([("a", 1), (2, 2)])


def test_row_that_is_not_a_pair_names_the_record():
    with pytest.raises(StoreError, match="record 1: expected a .key, value. pair, got str"):
        Store.build(["abc"])


# -- CSV ------------------------------------------------------------------------

@pytest.fixture(params=[None, "people.fsdb"], ids=["in memory", "to file"])
def csv_store(request, tmp_path):
    """Store.from_csv, in memory or to a file; closes what it built."""
    stores = []

    def build(csv_path, key, **options):
        path = request.param and tmp_path / request.param
        store = Store.from_csv(csv_path, key, path, **options)
        stores.append(store)
        return store

    yield build
    for store in stores:
        store.close()


def test_from_csv_maps_the_key_column_to_the_whole_row(tmp_path, csv_store):
    path = write_csv(tmp_path / "people.csv",
                     'name,email,team\nAna,ana@x,Sec\n陈静,chen@x,"Eng, Ops"\n')
    store = csv_store(path, "email")
    assert dict(store) == {
        "ana@x": {"name": "Ana", "email": "ana@x", "team": "Sec"},
        "chen@x": {"name": "陈静", "email": "chen@x", "team": "Eng, Ops"},
    }
    assert store.raw("ana@x") == b'{"name":"Ana","email":"ana@x","team":"Sec"}'


def test_csv_blank_lines_crlf_and_a_byte_order_mark_are_tolerated(tmp_path, csv_store):
    path = write_csv(tmp_path / "people.csv",
                     "\ufeffemail,name\r\n\r\nana@x,Ana\r\n\r\nbo@x,Bo\r\n")
    assert csv_store(path, "email") == {"ana@x": {"email": "ana@x", "name": "Ana"},
                                         "bo@x": {"email": "bo@x", "name": "Bo"}}


def test_csv_with_only_a_header_gives_an_empty_store(tmp_path, csv_store):
    assert len(csv_store(write_csv(tmp_path / "people.csv", "email,name\n"), "email")) == 0


def test_csv_without_the_key_column_names_the_columns_it_has(tmp_path):
    path = write_csv(tmp_path / "people.csv", "mail,name\nana@x,Ana\n")
    with pytest.raises(StoreError, match=r"has no column 'email'; the header \(line 1\) has these "
                                         r"columns: 'mail', 'name'"):
        Store.from_csv(path, "email")


def test_empty_csv_file_asks_for_a_header(tmp_path):
    with pytest.raises(StoreError, match="is empty: the first line must be a header"):
        Store.from_csv(write_csv(tmp_path / "people.csv", ""), "email")


def test_csv_header_with_a_repeated_column_is_refused(tmp_path):
    path = write_csv(tmp_path / "people.csv", "email,name,name\na,b,c\n")
    with pytest.raises(StoreError, match="line 1: column 'name' appears twice"):
        Store.from_csv(path, "email")


def test_csv_row_with_the_wrong_number_of_fields_names_its_line(tmp_path):
    # The quoted field spans lines 2-3, so the short row is on line 4.
    path = write_csv(tmp_path / "people.csv", 'email,name,note\na@x,A,"two\nlines"\nb@x,B\n')
    with pytest.raises(StoreError, match=r"people\.csv, line 4: 2 fields, but the header has 3"):
        Store.from_csv(path, "email")


def test_csv_row_with_an_empty_key_names_its_line(tmp_path):
    path = write_csv(tmp_path / "people.csv", "name,email\nAna,ana@x\nNobody,\n")
    with pytest.raises(StoreError, match=r"people\.csv, line 3: the key column 'email' is empty"):
        Store.from_csv(path, "email")


def test_csv_that_is_not_utf8_names_the_exact_line(tmp_path):
    # Far past the first 8 KiB, where a text-mode reader would misplace the error.
    lines = b"".join(b"user%d@x,Name %d\n" % (i, i) for i in range(1000))
    path = write_csv(tmp_path / "people.csv", b"email,name\n" + lines + b"ren\xe9@x,Ren\xe9\n")
    with pytest.raises(StoreError, match=r"people\.csv, line 1002: not valid UTF-8 .*iconv"):
        Store.from_csv(path, "email")


def test_csv_duplicate_key_names_both_lines(tmp_path):
    path = write_csv(tmp_path / "people.csv", "email,n\na@x,1\nb@x,2\n\nc@x,3\na@x,4\n")
    with pytest.raises(StoreError, match=r"duplicate key 'a@x': .*people\.csv, line 2 and "
                                         r".*people\.csv, line 6; keys must be unique"):
        Store.from_csv(path, "email", tmp_path / "people.fsdb")
    assert not (tmp_path / "people.fsdb").exists()


def test_csv_parse_error_names_its_line(tmp_path):
    huge = "x" * (csv.field_size_limit() + 1)
    path = write_csv(tmp_path / "people.csv", f"email,note\na@x,short\nb@x,{huge}\n")
    with pytest.raises(StoreError, match=r"people\.csv, line 3: field larger than field limit"):
        Store.from_csv(path, "email")


def test_csv_codec_that_cannot_hold_rows_names_the_line(tmp_path):
    path = write_csv(tmp_path / "people.csv", "email\na@x\n")
    expected = "line 2, key 'a@x': codec 'bytes' cannot encode the value: expected bytes, not dict"
    with pytest.raises(StoreError, match=expected):
        Store.from_csv(path, "email", codec="bytes")


def test_csv_progress_callable_hears_rows_and_bytes(tmp_path):
    rows = 2 * csvrows.PROGRESS_EVERY + 5
    path = write_csv(tmp_path / "people.csv", "email\n" + "".join(f"u{i}\n" for i in range(rows)))
    calls = []
    with Store.from_csv(path, "email", progress=lambda *args: calls.append(args)) as store:
        assert len(store) == rows
    size = path.stat().st_size
    every = csvrows.PROGRESS_EVERY
    assert [done for done, _, _ in calls] == [every, 2 * every, rows]
    assert all(total == size for _, _, total in calls)
    assert [read for _, read, _ in calls] == sorted(read for _, read, _ in calls)
    assert calls[-1][1] == size


def test_csv_progress_is_logged_by_default_when_a_build_is_slow(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(csvrows.LogProgress, "interval", 0.0)
    path = write_csv(tmp_path / "people.csv", "email\na@x\n")
    with caplog.at_level(logging.INFO, logger="forkserve.store"):
        Store.from_csv(path, "email").close()
    assert any("people.csv: 1 rows read, 100% of" in message for message in caplog.messages)


# -- properties -------------------------------------------------------------------

@settings(max_examples=75, deadline=None, database=None)
@given(st.dictionaries(st.text(), json_values, max_size=40))
def test_any_dict_of_json_values_round_trips_through_build_save_and_open(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("property") / "store.fsdb"
    with Store.build(data) as built:
        assert list(built.items()) == list(data.items())
        built.save(path)
    with Store.open(path) as opened:
        assert list(opened.items()) == list(data.items())
        assert all(opened[key] == value for key, value in data.items())


@settings(max_examples=75, deadline=None, database=None)
@given(st.dictionaries(st.binary(max_size=20), st.binary(max_size=50), max_size=40),
       st.lists(st.binary(max_size=20), max_size=10))
def test_any_bytes_keys_and_values_round_trip_and_absent_keys_stay_absent(data, probes):
    with Store.build(data, codec="bytes") as store:
        as_bytes = {key.encode("utf-8", "surrogateescape"): value for key, value in store.items()}
        assert as_bytes == data
        for probe in probes:
            assert store.get(probe) == data.get(probe)


# -- command line -------------------------------------------------------------------

def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "forkserve.store", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=60)


def test_cli_builds_describes_and_reads_a_store_file(tmp_path):
    path = write_csv(tmp_path / "people.csv", "email,name\nana@x,Ana\nbo@x,Bo\n")
    built = run_cli("build", path, "--key", "email", "-o", tmp_path / "people.fsdb")
    assert built.returncode == 0, built.stderr
    assert "people.fsdb: 2 records" in built.stdout
    info = run_cli("info", tmp_path / "people.fsdb", "--verify")
    assert info.returncode == 0, info.stderr
    assert re.search(r"^codec: +row$", info.stdout, re.M)
    assert re.search(r"^fields: +2, stored once: email, name$", info.stdout, re.M)
    assert re.search(r"^records: +2$", info.stdout, re.M)
    assert re.search(r"^verified: +every record", info.stdout, re.M)
    got = run_cli("get", tmp_path / "people.fsdb", "bo@x")
    assert (got.returncode, got.stdout) == (0, '{"email":"bo@x","name":"Bo"}\n')
    missing = run_cli("get", tmp_path / "people.fsdb", "nobody@x")
    assert missing.returncode == 1 and "no record for 'nobody@x'" in missing.stderr


def test_cli_reports_bad_input_without_a_traceback(tmp_path):
    path = write_csv(tmp_path / "people.csv", "email,name\nana@x\n")
    result = run_cli("build", path, "--key", "email", "-o", tmp_path / "people.fsdb")
    assert result.returncode == 1
    assert "error:" in result.stderr and "line 2: 1 fields" in result.stderr
    assert "Traceback" not in result.stderr


# -- memory sharing --------------------------------------------------------------------

RECORDS = 200_000

MEMORY_SCRIPT = textwrap.dedent("""
    import gc, json, os, sys
    from forkserve.store import Store

    def email(i):
        return f"person{i}.{i * 7919 % 100003}@example-corp.com"

    def person(i):
        # Ten fields, each a new str per record, as a CSV loader makes them.
        return {"email": email(i), "first_name": f"First{i % 5003}",
                "last_name": f"Last{i * 31 % 9001}",
                "employee_id": f"E{i:08d}", "department": f"Department {i % 17}",
                "title": f"Analyst, level {i % 7}", "manager_email": email(i // 10),
                "phone": f"+1-555-{i % 10000:04d}-{i * 13 % 10000:04d}",
                "office": f"Berlin HQ, floor {i % 12}",
                "hired": f"20{i % 25:02d}-{i % 12 + 1:02d}-01"}

    def rows(n):
        for i in range(n):
            record = person(i)
            yield record["email"], record

    def kib(path, *fields):
        found = {}
        with open(path) as file:
            for line in file:
                name, _, rest = line.partition(":")
                if name in fields:
                    found[name] = int(rest.split()[0])
        return sum(found[field] for field in fields) * 1024

    def lookup_every_record(store, n):
        step = 7919  # a prime not dividing n: j * step % n visits every record once
        for j in range(n):
            i = j * step % n
            if store[email(i)]["employee_id"] != f"E{i:08d}":
                os._exit(3)

    def main(mode, n, path=None):
        before = kib("/proc/self/status", "VmRSS")
        if mode == "dicts":
            data = dict(rows(n))
            print(json.dumps({"rss_growth": kib("/proc/self/status", "VmRSS") - before}))
            return
        store = Store.build(rows(n), path)
        report = {"rss_growth": kib("/proc/self/status", "VmRSS") - before, "nbytes": store.nbytes}
        if path:
            store.close()
            store = Store.open(path)
            store.verify()  # maps every page here first, as a serving master would have
        gc.collect()
        gc.freeze()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            lookup_every_record(store, n)
            private = kib("/proc/self/smaps_rollup", "Private_Clean", "Private_Dirty")
            os.write(write_end, str(private).encode())
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            report["child_private"] = int(pipe.read() or -1)
        _, status = os.waitpid(pid, 0)
        report["child_exit"] = os.waitstatus_to_exitcode(status)
        print(json.dumps(report))

    main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:])
""")


def run_memory_script(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, *map(str, args)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux_only
@pytest.mark.memory
@pytest.mark.parametrize("source", ["built in memory", "opened from file"])
def test_forked_child_reading_every_record_keeps_under_5_percent_private(tmp_path, source):
    path = [tmp_path / "people.fsdb"] if source == "opened from file" else []
    report = run_memory_script("store", RECORDS, *path)
    assert report["child_exit"] == 0, "a lookup in the child returned the wrong record"
    assert report["child_private"] < 0.05 * report["nbytes"], report


@linux_only
@pytest.mark.memory
def test_store_grows_the_master_by_under_half_of_the_same_data_as_dicts():
    store = run_memory_script("store", RECORDS)
    dicts = run_memory_script("dicts", RECORDS)
    assert store["rss_growth"] < 0.5 * dicts["rss_growth"], (store, dicts)


# -- size against the CSV ----------------------------------------------------------------

#: Rows per shape here; benchmarks/store_size.py runs more. The ratio hardly
#: depends on the count (the hash table is sized to the record count), so the
#: slow generators run smaller; "short" runs the 200,000 rows of issue 14.
SIZE_ROWS = {"persondb": 10_000, "short": 200_000, "wide": 2_000, "long": 1_000,
             "unicode": 50_000}


@pytest.mark.parametrize("shape", SIZE_ROWS)
def test_store_file_is_at_most_1_2x_its_csv_index_included(tmp_path, shape):
    from benchmarks import store_size

    result = store_size.measure(shape, tmp_path, SIZE_ROWS[shape])
    assert result["rows"] == SIZE_ROWS[shape]
    assert result["ratio"] <= store_size.MAX_RATIO, result
    key = store_size.SHAPES[shape][1]
    with open(tmp_path / f"{shape}.csv", newline="", encoding="utf-8") as file:
        first = next(csv.DictReader(file))
    with Store.open(tmp_path / f"{shape}.fsdb") as store:
        assert store[first[key]] == first
        assert store.raw(first[key]) == orjson.dumps(first)


# -- one file, several unrelated processes ---------------------------------------------------

READER_SCRIPT = textwrap.dedent("""
    import sys
    from forkserve.store import Store

    store = Store.open(sys.argv[1])
    store.verify()  # reads, so maps, every page of the file
    print("ready", flush=True)
    sys.stdin.read()  # hold the mapping until the test closes our stdin
""")


def people_file(path, count, width):
    """Build a store file of `count` people with a `width`-fold id field;
    returns (path, its size)."""
    rows = ((f"person{i}@example.com", {"email": f"person{i}@example.com", "n": str(i) * width})
            for i in range(count))
    Store.build(rows, path, codec="row").close()
    return path, path.stat().st_size


def mapping_of(pid, path):
    """smaps_rollup-shaped fields of the mapping of `path` in process pid."""
    from forkserve.memory.procfs import parse_smaps_rollup

    with open(f"/proc/{pid}/smaps", "rb") as file:
        blocks = re.split(rb"^(?=[0-9a-f]+-[0-9a-f]+ )", file.read(), flags=re.M)
    [block] = [block for block in blocks
               if block.split(b"\n", 1)[0].endswith(b" " + os.fsencode(path))]
    return parse_smaps_rollup(block)


@linux_only
@pytest.mark.memory
def test_unrelated_processes_opening_one_store_file_share_its_pages(tmp_path):
    # As separate forkserve instances (containers, systemd units) do: neither
    # process is forked from the other, only the file is common.
    path, size = people_file(tmp_path / "people.fsdb", 40_000, 20)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    readers = [subprocess.Popen([sys.executable, "-c", READER_SCRIPT, str(path)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
               for _ in range(2)]
    try:
        for reader in readers:
            assert reader.stdout.readline() == b"ready\n"
        for reader in readers:
            mapped = mapping_of(reader.pid, path)
            assert mapped["Rss"] >= 0.9 * size, mapped
            assert mapped["Shared_Clean"] >= 0.9 * mapped["Rss"], mapped
            assert mapped["Pss"] <= 0.6 * mapped["Rss"], mapped  # each pays half
    finally:
        for reader in readers:
            reader.stdin.close()
            reader.wait(timeout=30)
            reader.stdout.close()


def cached_bytes(path):
    """Bytes of `path` in the page cache (util-linux's fincore)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES",
                          str(path)], capture_output=True, text=True, check=True).stdout
    return int(out)


def evict(path):
    """Drop `path`'s pages from the page cache; False where the filesystem
    keeps them in memory anyway (tmpfs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return cached_bytes(path) < os.path.getsize(path) // 4


@linux_only
@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs fincore (util-linux)")
def test_prefetch_reads_the_file_into_the_page_cache_and_populate_maps_it(tmp_path):
    # 78 MB: many times the read-ahead window (8 MiB on the machine this was
    # written on: a lazy open then caches 12.6 MB, around the header and the
    # trailer), so that a lazy open cannot pass for a prefetching one.
    path, size = people_file(tmp_path / "people.fsdb", 300_000, 40)
    if not evict(path):
        pytest.skip(f"{tmp_path}'s filesystem keeps files in memory: nothing to read in")
    with Store.open(path) as store:  # lazy: only around the header and the trailer
        assert cached_bytes(path) < 0.75 * size
        assert store["person7@example.com"]["n"] == "7" * 40
    assert evict(path)
    with Store.open(path, prefetch=True) as store:
        # The kernel reads it in the background. WILLNEED is a hint it may
        # drop a few of under I/O load (seen: 99.7% cached after 30 s on a
        # machine running several test suites), so the deadline asks for most.
        deadline = time.monotonic() + 30
        while cached_bytes(path) < size and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cached_bytes(path) >= 0.95 * size, f"{cached_bytes(path)} of {size} bytes cached"
        assert mapping_of(os.getpid(), path)["Rss"] < size // 4  # cached, not mapped here
    assert evict(path)
    with Store.open(path, populate=True) as store:  # read and mapped before it returns
        assert cached_bytes(path) >= size  # whole pages
        assert mapping_of(os.getpid(), path)["Rss"] >= size


def test_a_hash_index_with_no_empty_slot_is_reported_as_damaged_not_looped_on(tmp_path):
    path = tmp_path / "people.fsdb"
    Store.build({f"k{i}": i for i in range(10)}.items(), str(path)).close()
    with Store.open(str(path)) as store:
        layout_ = store._layout
        start, count = layout_.tags_start, layout_.nslots
    data = bytearray(path.read_bytes())
    data[start:start + 2 * count] = b"\x01\x00" * count  # every slot taken, no tag matches
    path.write_bytes(bytes(data))
    with Store.open(str(path)) as store:
        with pytest.raises(StoreFormatError, match="no empty slot"):
            store.get("absent")
