"""PersonDB: an employee directory held in memory and served by email.

    forkserve -w 4 examples.persondb.app:app                  # small demo dataset
    PERSONDB_CSV=out/people.csv PERSONDB_MODE=store forkserve -w 4 examples.persondb.app:app

The dataset is loaded when this module is imported, so under a pre-fork
server that preloads the app (forkserve always does; ``gunicorn --preload``)
it is loaded once, in the master, and the workers inherit it.

Settings (environment variables, read once at import):

``PERSONDB_CSV``
    The CSV to serve (columns as written by ``examples.persondb.generate``;
    only ``email`` is required). Unset: a small deterministic dataset of
    ``PERSONDB_ROWS`` rows (default 2,000, seed ``PERSONDB_SEED``) is
    generated into the temp directory, so the example works with no setup.
``PERSONDB_MODE``
    How the rows are held, the one thing the benchmark varies:

    - ``dict``: a dict of plain row dicts keyed by email (what most services
      do; every lookup writes reference counts, so workers copy pages).
    - ``share``: the same dicts, passed to ``forkserve.share()`` before the
      fork, which keeps their pages shared (Python 3.12+).
    - ``store``: a ``forkserve.store.Store`` built from the CSV and cached in
      ``PERSONDB_STORE`` (default: the CSV path + ``.store``); field names
      are stored once, and responses are ``get_raw()``'s JSON bytes, made
      from the stored field bytes without decoding them.
      With ``PERSONDB_STORE`` set and ``PERSONDB_CSV`` unset, that store file
      is served as it is: no CSV, no rebuild (a file built beforehand and
      mounted read-only).
``PERSONDB_SHARD``
    ``I/N``: serve only shard I (from 0) of N, the people whose email
    ``forkserve.store.shards.shard_of(email, N)`` places there, as nginx's
    split_clients routes them (examples/deploy). In ``store`` mode the
    shard's store is cached in ``PERSONDB_STORE`` (default: the CSV path +
    ``.shardI-of-N.store``, the name ``forkserve store build --shards N``
    gives it). A request for an email of another shard answers 421
    Misdirected Request, so a routing mistake never looks like a 404.

Routes: ``GET /person/<email>`` (JSON; 404 JSON when unknown; emails match
exactly) and ``GET /health`` (row count, mode, shard and the serving pid).
A worker answers /health only after the dataset is loaded (in the master,
before any worker is forked), which makes it the readiness check.
"""

import csv
import logging
import os
import sys
import tempfile
import time

import bottle
import orjson

from examples.persondb import generate
from forkserve.store import shards

__all__ = ["MODES", "PersonDBError", "Settings", "app", "load", "make_app", "people"]

MODES = ("dict", "share", "store")

log = logging.getLogger("persondb")

_JSON = "application/json"


class PersonDBError(RuntimeError):
    """The dataset cannot be loaded; the message says which file and what to do."""


class Settings:
    """The environment variables above, read and checked in one place."""

    def __init__(self, environ):
        self.mode = environ.get("PERSONDB_MODE", "dict").strip().lower() or "dict"
        if self.mode not in MODES:
            raise PersonDBError(
                f"PERSONDB_MODE={self.mode!r} is not one of {', '.join(MODES)}; "
                "set it to one of those or unset it (default: dict)."
            )
        self.csv_path = environ.get("PERSONDB_CSV") or None
        self.rows = _int_setting(environ, "PERSONDB_ROWS", generate.DEFAULT_ROWS)
        self.seed = _int_setting(environ, "PERSONDB_SEED", generate.DEFAULT_SEED)
        self.store_path = environ.get("PERSONDB_STORE") or None
        self.shard = None
        if environ.get("PERSONDB_SHARD"):
            try:
                self.shard = shards.parse_shard(environ["PERSONDB_SHARD"])
            except shards.ShardError as exc:
                raise PersonDBError(f"PERSONDB_SHARD: {exc}") from None

    def dataset(self):
        """The CSV path to load, generating the demo dataset if none is set.

        None in store mode with PERSONDB_STORE and no PERSONDB_CSV: the
        store file is served as it is (built beforehand, e.g. by
        ``forkserve store build --shards N``, and mounted read-only).
        """
        if self.csv_path is not None:
            return self.csv_path
        if self.mode == "store" and self.store_path is not None:
            return None
        path = os.path.join(
            tempfile.gettempdir(), f"persondb-{self.rows}rows-seed{self.seed}.csv"
        )
        if not os.path.exists(path):
            log.info("PERSONDB_CSV is unset: generating %d demo rows into %s", self.rows, path)
            generate.generate_file(path, self.rows, self.seed)
        return path


def _int_setting(environ, name, default):
    value = environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise PersonDBError(f"{name}={value!r} is not an integer") from None


# -- loading -------------------------------------------------------------------


def _open_csv(path):
    try:
        f = open(path, newline="", encoding="utf-8")
    except FileNotFoundError:
        raise PersonDBError(
            f"PersonDB CSV {path!r} does not exist. Create it with "
            f"'python -m examples.persondb.generate --rows 100000 -o {path}', "
            "or unset PERSONDB_CSV to serve a small generated dataset."
        ) from None
    except IsADirectoryError:
        raise PersonDBError(f"PersonDB CSV {path!r} is a directory; point PERSONDB_CSV at a file.") from None
    except PermissionError:
        raise PersonDBError(f"PersonDB CSV {path!r} is not readable by this user.") from None
    reader = csv.DictReader(f)
    try:
        header = reader.fieldnames
    except (UnicodeDecodeError, csv.Error) as e:
        f.close()
        raise PersonDBError(f"PersonDB CSV {path!r} cannot be read as UTF-8 CSV ({e}).") from None
    if not header or "email" not in header:
        f.close()
        found = f"its header is {header!r}" if header else "it is empty"
        raise PersonDBError(
            f"PersonDB CSV {path!r} has no 'email' column ({found}). "
            "Expected the columns written by 'python -m examples.persondb.generate'."
        )
    return f, reader


def in_shard(shard):
    """A predicate telling whether an email belongs to shard (I, N); None: every email."""
    if shard is None:
        return lambda email: True
    index, count = shard
    bounds = shards.upper_bounds(count)
    return lambda email: shards.shard_of(email, count, bounds=bounds) == index


#: seconds between "so far" lines while reading or building
PROGRESS_INTERVAL = 5.0
#: rows between looks at the clock while reading
PROGRESS_ROWS = 10_000


def load_dicts(path, shard=None):
    """Read the CSV into ``{email: row dict}``, streaming it row by row, with a
    line every PROGRESS_INTERVAL seconds saying how many people are read."""
    f, reader = _open_csv(path)
    wanted = in_shard(shard)
    people = {}
    started = last = time.monotonic()
    with f:
        try:
            for row in reader:
                if not wanted(row["email"]):
                    continue
                people[row["email"]] = row
                if (len(people) % PROGRESS_ROWS == 0
                        and time.monotonic() - last >= PROGRESS_INTERVAL):
                    last = time.monotonic()
                    log.info("reading %s: %d people so far, %.0f s", path, len(people),
                             last - started)
        except (UnicodeDecodeError, csv.Error) as e:
            raise PersonDBError(
                f"PersonDB CSV {path!r} is malformed near line {reader.line_num} ({e})."
            ) from None
    return people


def load_store(path, store_path=None, shard=None):
    """Open the Store cached beside ``path``, rebuilding it if the CSV is newer.

    A cached file that this forkserve cannot read (written by another format
    version, or damaged) is rebuilt too: it is only a cache of the CSV.
    """
    from forkserve.store import Store, StoreError, StoreFormatError
    from forkserve.store.split import shard_path

    if path is None:
        try:
            return Store.open(store_path, prefetch=True)
        except (OSError, StoreError) as exc:
            raise PersonDBError(
                f"PERSONDB_STORE {store_path!r} cannot be opened ({exc}); build it with "
                f"'forkserve store build people.csv --key email -o people.store [--shards N]', "
                "or set PERSONDB_CSV to build it from a CSV.") from None
    # Check the CSV first so a bad file gets PersonDB's error message.
    f, _ = _open_csv(path)
    f.close()
    if store_path is None:
        store_path = f"{path}.store" if shard is None else shard_path(f"{path}.store", *shard)
    try:
        fresh = os.stat(store_path).st_mtime >= os.stat(path).st_mtime
    except FileNotFoundError:
        fresh = False
    if fresh:
        # The file's pages live in the page cache, once, shared by every
        # process that maps them: workers, reload generations and any other
        # instance on the host that opens the same file. prefetch=True starts
        # reading them in now, so that the first requests do not wait for the
        # disk when the cache has dropped them. (populate=True would also map
        # them all into the master: no first-touch faults at all, at the cost
        # of reading the whole file before serving.)
        try:
            return Store.open(store_path, prefetch=True)
        except StoreFormatError as exc:
            log.warning("rebuilding the cached store: %s", exc)
    _build_store(path, store_path, shard)
    return Store.open(store_path, prefetch=True)


def _build_store(path, store_path, shard):
    from forkserve.store import Store
    from forkserve.store.csvrows import CsvRows

    # Build beside the target and rename: a concurrent loader never opens a
    # half-written store, and processes that map the old file keep reading
    # the old one (its pages are never rewritten under them).
    tmp = f"{store_path}.{os.getpid()}.tmp"
    started = time.monotonic()
    last = [started]

    def progress(rows, bytes_read, total_bytes):
        now = time.monotonic()
        if now - last[0] >= PROGRESS_INTERVAL:
            last[0] = now
            log.info("building %s: %d people so far (%.0f%% of %.1f MB), %.0f s", store_path,
                     rows, 100 * bytes_read / (total_bytes or 1), total_bytes / 1e6,
                     now - started)

    log.info("building the store %s from %s", store_path, path)
    try:
        if shard is None:
            store = Store.from_csv(path, key="email", path=tmp, progress=progress)
        else:
            wanted = in_shard(shard)
            rows = (row for row in CsvRows(path, "email", progress) if wanted(row[0]))
            store = Store.build(rows, tmp, codec="row")
        log.info("built the store %s: %d people in %.1f s", store_path, len(store),
                 time.monotonic() - started)
        store.close()
        os.replace(tmp, store_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(path, mode, store_path=None, shard=None):
    """Load ``path`` the way ``mode`` says; returns the mapping to serve from.

    shard (I, N) keeps only the people of shard I of N.
    """
    started = time.perf_counter()
    if mode == "store":
        people = load_store(path, store_path, shard)
    else:
        people = load_dicts(path, shard)
        if mode == "share":
            import forkserve

            report = forkserve.share(people)
            log.info("forkserve.share: %s", report)
    log.info(
        "loaded %d people from %s in %.2fs (mode=%s, shard=%s, pid=%d)",
        len(people), path or store_path, time.perf_counter() - started, mode, _shard_name(shard),
        os.getpid(),
    )
    return people


# -- the WSGI app --------------------------------------------------------------


def _shard_name(shard):
    return None if shard is None else f"{shard[0]}/{shard[1]}"


def make_app(people, mode, shard=None):
    """A Bottle app serving ``people`` (a dict of rows, or a Store), shard I/N of them."""
    app = bottle.Bottle()
    elsewhere = _misdirected(shard)

    if mode == "store":
        @app.get("/person/<email>")
        def person(email):
            # JSON bytes straight from the stored fields: no dict, no encoder.
            body = people.get_raw(email)
            if body is None:
                return elsewhere(email) or _not_found(email)
            bottle.response.content_type = _JSON
            return body
    else:
        @app.get("/person/<email>")
        def person(email):
            row = people.get(email)
            if row is None:
                return elsewhere(email) or _not_found(email)
            # Hand Bottle a copy, as services do so that plugins and hooks
            # can never change the shared dataset. Copying takes a reference
            # to every field, so each lookup writes the refcounts of the
            # row's objects and the pages holding them are copied into this
            # worker, unless they are immortal (forkserve.share, 3.12+).
            # (Returning `row` itself touches less on 3.12+: its C JSON
            # encoder borrows a dict's values instead of referencing them,
            # while 3.11's takes a reference to each.)
            return dict(row)

    @app.get("/health")
    def health():
        return {"status": "ok", "rows": len(people), "mode": mode, "shard": _shard_name(shard),
                "pid": os.getpid()}

    @app.error(404)
    @app.error(405)
    def no_route(error):
        bottle.response.content_type = _JSON
        return orjson.dumps({"error": error.status_line, "path": bottle.request.path})

    return app


def _misdirected(shard):
    """A function answering 421 for an email of another shard, and None for this one's."""
    if shard is None:
        return lambda email: None
    index, count = shard
    bounds = shards.upper_bounds(count)

    def elsewhere(email):
        owner = shards.shard_of(email, count, bounds=bounds)
        if owner == index:
            return None
        return bottle.HTTPResponse(
            orjson.dumps({"error": "misdirected: this instance serves another shard",
                          "email": email, "shard": f"{index}/{count}",
                          "owner": f"{owner}/{count}"}),
            status=421, content_type=_JSON,
        )
    return elsewhere


def _not_found(email):
    return bottle.HTTPResponse(
        orjson.dumps({"error": "not found", "email": email}), status=404, content_type=_JSON,
    )


def _configure_logging():
    # An app must not take over the process's logging, but our load report
    # should be visible under any server: add a stderr handler only when
    # nobody configured logging.
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[persondb] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


_configure_logging()
settings = Settings(os.environ)
people = load(settings.dataset(), settings.mode, settings.store_path, settings.shard)
app = make_app(people, settings.mode, settings.shard)
