"""How big is a store file against the CSV it was built from?

    python benchmarks/store_size.py                 # every shape, full size
    python benchmarks/store_size.py --scale 0.1     # a tenth of the rows
    python benchmarks/store_size.py --quick         # a hundredth
    python benchmarks/store_size.py --shapes short,unicode --codec json

For each row shape below it writes a deterministic CSV into a temporary
directory, builds a store file from it with `Store.from_csv` and prints the
CSV size, the store size (records, field names, index, everything in the
file) and their ratio, and how long the build took (wall time: on a shared
machine, a rough figure). Writes result.json (the harness's schema) in --out. tests/test_store.py
builds the same shapes and asserts the ratio stays under MAX_RATIO.

What a record costs in the file (codec "row", the default for a CSV): a
varint key length, the key, a varint value length, a flag byte and the
field values separated by one byte (the key column is not stored twice),
and about 8 bytes of hash index (a uint16 tag and a uint32 position per
slot, slots at most 75% full). A CSV spends a comma or newline per field and quotes
around fields with commas, so the two come out close; the index is what
remains.

The shapes:

- persondb: examples/persondb/generate.py, 29 columns, ~1 KB a row;
- short:    8 short columns (an e-mail key, names, a city, a date), ~90 B;
- wide:     120 columns of a few characters each;
- long:     4 columns, one of them a 2-8 KB text with quotes and newlines;
- unicode:  8 columns of CJK, Cyrillic, accented Latin and emoji text.
"""

import argparse
import csv
import os
import random
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness.machine import Conditions, add_quick_option, parse_quick  # noqa: E402
from benchmarks.harness.results import table, write_result  # noqa: E402
from examples.persondb import generate  # noqa: E402
from forkserve.store import Store  # noqa: E402

__all__ = ["MAX_RATIO", "SHAPES", "write_shape", "measure", "main"]

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("shape", "shape"), ("rows", "rows"), ("csv", "CSV", "MiB"), ("store", "store file", "MiB"),
    ("ratio", "store / CSV", "×"), ("build_s", "build"),
)

#: The most a store file may weigh against its CSV, index included (issue 14).
MAX_RATIO = 1.2

_SYLLABLES = "ka lo mi ne ru sa ti vo ya ze an el in or us".split()
_CITIES = ("Lisbon", "Porto", "Berlin", "Austin", "Osaka", "Lagos", "Quito", "Perth")
_WORDS = ("the", "store", "keeps", "every", "field", "once", "and", "says", "so",
          '"quoted"', "commas,", "in", "text")
_UNICODE = ("陈静", "Łukasz Żółć", "Ольга Смирнова", "Zoë Ångström", "山田太郎",
            "José Núñez", "Αθηνά", "🙂 Happy", "محمد", "Nguyễn Văn An")


def _name(rng, parts=2):
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def _persondb(rows, seed):
    for n in range(rows):
        person = generate.person(seed, n)
        yield [person[field] for field in generate.FIELDS]


def _short(rows, seed):
    rng = random.Random(seed)
    yield ["email", "first", "last", "city", "country", "age", "joined", "status"]
    for n in range(rows):
        first, last = _name(rng), _name(rng, 3)
        yield [f"{first}.{last}.{n}@example.com".lower(), first, last, rng.choice(_CITIES),
               rng.choice(("PT", "DE", "US", "JP", "NG")), str(rng.randint(18, 90)),
               f"20{rng.randint(10, 25)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
               rng.choice(("active", "idle", "locked"))]


def _wide(rows, seed, columns=120):
    rng = random.Random(seed)
    yield ["id", *(f"c{i}" for i in range(1, columns))]
    for n in range(rows):
        yield [f"row{n}", *(str(rng.randint(0, 999)) for _ in range(columns - 1))]


def _long(rows, seed):
    rng = random.Random(seed)
    yield ["id", "title", "body", "tags"]
    for n in range(rows):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(400, 1600))]
        for i in range(0, len(words), 60):
            words[i] += "\n"
        yield [f"doc-{n}", _name(rng, 4), " ".join(words), ";".join(rng.sample(_WORDS, 3))]


def _unicode(rows, seed):
    rng = random.Random(seed)
    yield ["key", "name", "alias", "city", "note", "lang", "score", "emoji"]
    for n in range(rows):
        yield [f"{rng.choice(_UNICODE)}-{n}", rng.choice(_UNICODE), rng.choice(_UNICODE),
               rng.choice(("東京", "Kraków", "São Paulo", "Москва", "القاهرة")),
               " ".join(rng.choice(_UNICODE) for _ in range(3)),
               rng.choice(("zh", "pl", "ru", "sv", "ja")), f"{rng.random():.3f}",
               rng.choice("🙂🚀✓☕️🎉")]


def _persondb_with_header(rows, seed):
    yield list(generate.FIELDS)
    yield from _persondb(rows, seed)


#: name -> (row generator, its key column, rows in a full run)
SHAPES = {
    "persondb": (_persondb_with_header, "email", 100_000),
    "short": (_short, "email", 200_000),
    "wide": (_wide, "id", 20_000),
    "long": (_long, "id", 10_000),
    "unicode": (_unicode, "key", 100_000),
}


def write_shape(name, path, rows=None, seed=1):
    """Write shape `name` as a CSV of `rows` rows (default: the full run) to path."""
    make, key, full = SHAPES[name]
    with open(path, "w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows(make(full if rows is None else rows, seed))
    return key


def measure(name, directory, rows=None, codec=None):
    """Build shape `name` in directory; return a dict of its sizes and build time."""
    csv_path = Path(directory) / f"{name}.csv"
    store_path = Path(directory) / f"{name}.fsdb"
    key = write_shape(name, csv_path, rows)
    options = {} if codec is None else {"codec": codec}
    started = time.perf_counter()
    with Store.from_csv(csv_path, key, store_path, progress=lambda *_: None, **options) as store:
        records = len(store)
    seconds = time.perf_counter() - started
    csv_bytes, store_bytes = csv_path.stat().st_size, store_path.stat().st_size
    return {"shape": name, "rows": records, "csv": csv_bytes, "store": store_bytes,
            "ratio": store_bytes / csv_bytes, "build_s": seconds}


QUICK = {"scale": 0.01}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help=f"comma-separated shapes (default: all of {', '.join(SHAPES)})")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full rows")
    parser.add_argument("--codec", help="value codec (default: Store.from_csv's)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"
                                             / "store_size"),
                        help="where result.json goes (%(default)s)")
    add_quick_option(parser, QUICK)
    args = parse_quick(parser, argv, QUICK)
    shapes = [name.strip() for name in args.shapes.split(",") if name.strip()]
    unknown = [name for name in shapes if name not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    conditions, results = Conditions(), []
    with tempfile.TemporaryDirectory(prefix="forkserve-store-size-") as directory:
        for name in shapes:
            rows = max(1, int(SHAPES[name][2] * args.scale))
            result = measure(name, directory, rows, args.codec)
            results.append(result)
            for suffix in (".csv", ".fsdb"):
                os.unlink(Path(directory) / f"{name}{suffix}")
            print(f"{name}: {result['ratio']:.2f}x", file=sys.stderr, flush=True)
    print("\n".join(table(results, RESULT_COLUMNS)))
    write_result("store_size.py", argv, results, conditions, args.out,
                 title=f"store file against its CSV, codec {args.codec or 'default'}")


if __name__ == "__main__":
    main()
