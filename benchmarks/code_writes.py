"""Which bytes of the master's code objects does a worker write after --share-heap?

    python benchmarks/code_writes.py                          # the Flask shop, cold
    python benchmarks/code_writes.py --warmup 3               # after 3 warm-up rounds
    python benchmarks/code_writes.py --app django --warmup 3  # the Django shop, logged in
    python benchmarks/code_writes.py --app django --warmup 3,30,100

In this process (the "master"): load tests/apps/flask_shop or
tests/apps/django_shop, optionally warm every page of its client up N times
in-process (forkserve.process.warmup.Client; Django logs in to the admin
first, as tests/apps/django_shop/warmup.conf.py does), make the heap
immortal (forkserve.memory.heap.share_heap), and copy the raw bytes of the
code object of every function. Then fork; the child serves every page
ROUNDS times through the same in-process client and compares each code
object's bytes with the copy. Reported: code objects changed, 4 KiB pages
they dirtied, and every changed 2-byte code unit of co_code_adaptive
classified by what it is: an instruction whose opcode changed (specialised,
or deoptimised back), or an inline cache entry; for cache entries, whether
the instruction is still in its adaptive (unspecialised) form, whose first
cache entry is a counter that every execution writes, or specialised. The
most frequent instructions are listed. Python 3.12+.

Several --warmup values fork one child per value, after that many rounds in
total in the master (the rounds accumulate: 3,30 runs 3 rounds, measures,
then 27 more).
"""

import argparse
import collections
import ctypes
import dis
import gc
import os
import runpy
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "apps"))

ROUNDS = 5
PAGE = 4096


def raw(obj):
    return ctypes.string_at(id(obj), sys.getsizeof(obj))


def adaptive_offset():
    """Where co_code_adaptive starts inside a code object: found on a function
    whose instructions have no inline caches, so its adaptive code equals co_code."""
    def fresh(a, b):
        return a
    code = fresh.__code__
    offset = raw(code).find(code.co_code)
    if offset < 0:
        raise RuntimeError("co_code_adaptive not found in a fresh code object")
    return offset


def cache_entries(opcode):
    table = dis._inline_cache_entries
    if isinstance(table, list):  # 3.12: by opcode
        return table[opcode]
    return table.get(dis.opname[opcode], 0)  # 3.13: by name


def unit_kinds(code):
    """For each code unit of co_code: (base opname, index in its instruction:
    0 the instruction itself, 1.. its cache entries)."""
    base = code.co_code
    kinds = []
    index = 0
    while index < len(base) // 2:
        opcode = base[2 * index]
        name = dis.opname[opcode]
        kinds.append((name, 0))
        for entry in range(cache_entries(opcode)):
            kinds.append((name, entry + 1))
        index += 1 + cache_entries(opcode)
    return kinds


def adaptive_name(opcode):
    """3.12/3.13 list specialised names after the base ones; the base form of
    an instruction is its adaptive (counting) form."""
    names = getattr(dis, "_all_opname", None) or dis.opname
    return names[opcode] if opcode < len(names) else f"<{opcode}>"


def load(app_name):
    if app_name == "flask":
        from flask_shop import app
        from flask_shop.client import PAGES
        return app, sorted(set(PAGES)), None
    os.environ.setdefault("DJANGO_SHOP_DB", "/tmp/forkserve-code-writes.sqlite3")
    from django_shop.client import PAGES
    from django_shop.wsgi import application
    config = runpy.run_path(os.path.join(ROOT, "tests", "apps", "django_shop",
                                         "warmup.conf.py"))
    return application, list(PAGES), config


def logged_in_client(app, config):
    from forkserve.process.warmup import Client
    client = Client(app)
    if config is not None:  # Django: log in as warmup.conf.py does
        client.get("/admin/login/")
        answer = client.post("/admin/login/", {
            "username": "admin", "password": "admin-password", "next": "/admin/",
            "csrfmiddlewaretoken": client.cookies["csrftoken"]})
        assert answer.code == 302, answer.status
    return client


def compare(codes, before, offset):
    changed, pages = 0, set()
    counts = collections.Counter()
    instructions = collections.Counter()
    for code in codes:
        old, new = before[id(code)], raw(code)
        if old == new:
            continue
        changed += 1
        kinds = unit_kinds(code)
        for position, (a, b) in enumerate(zip(old, new)):
            if a != b:
                pages.add((id(code) + position) // PAGE)
        for unit in range((len(old) - offset) // 2):
            start = offset + 2 * unit
            if old[start:start + 2] == new[start:start + 2] or unit >= len(kinds):
                continue
            name, entry = kinds[unit]
            if entry == 0:
                kind = f"opcode changed: {adaptive_name(old[start])} -> {adaptive_name(new[start])}"
                counts["instruction (opcode or oparg)"] += 1
            else:
                # the instruction this cache belongs to, as it is now
                head = start - 2 * entry
                now = adaptive_name(new[head])
                state = "adaptive" if now == name else "specialised"
                kind = f"cache {entry} of {now} ({state})"
                counts[f"cache entry of {'an' if state == 'adaptive' else 'a'} {state} instruction"
                       + (" (its counter)" if entry == 1 else "")] += 1
            instructions[kind] += 1
        header = [i for i in range(min(offset, len(old))) if old[i] != new[i]]
        counts["header bytes"] += len(header)
    return changed, len(pages), counts, instructions


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--app", choices=("flask", "django"), default="flask")
    p.add_argument("--warmup", default="0",
                   help="warm-up rounds in the master before sharing; comma-separated for several")
    p.add_argument("--top", type=int, default=12, help="most written instructions to list")
    args = p.parse_args(argv)
    steps = [int(n) for n in args.warmup.split(",")]
    gc.disable()
    app, pages, config = load(args.app)
    from forkserve.memory import heap
    offset = adaptive_offset()
    client = logged_in_client(app, config)
    done = 0
    for total in steps:
        for _ in range(total - done):
            for page in pages:
                client.get(page)
        done = total
        measure(args, app, pages, config, offset, heap, total)


def measure(args, app, pages, config, offset, heap, rounds):
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the "master" after its warm-up: share, snapshot, fork the "worker"
        os.close(reader)
        functions = [o for o in gc.get_objects() if isinstance(o, types.FunctionType)]
        codes = list({id(f.__code__): f.__code__ for f in functions}.values())
        report = heap.share_heap()
        before = {id(code): raw(code) for code in codes}
        worker = os.fork()
        if worker == 0:
            client = logged_in_client(app, config)
            for _ in range(ROUNDS):
                for page in pages:
                    client.get(page)
            changed, dirty, counts, instructions = compare(codes, before, offset)
            lines = [f"Python {sys.version.split()[0]}, {args.app}, warm-up rounds {rounds}, "
                     f"{report}: {changed:,} of {len(codes):,} code objects changed, "
                     f"{dirty:,} pages of 4 KiB dirtied, after {ROUNDS} rounds of "
                     f"{len(pages)} pages"]
            lines += [f"  {n:>7,} code units: {kind}" for kind, n in counts.most_common()]
            lines += [f"  {n:>7,}   {kind}" for kind, n in instructions.most_common(args.top)]
            os.write(writer, ("\n".join(lines) + "\n").encode())
            os._exit(0)
        os.waitpid(worker, 0)
        os._exit(0)
    os.close(writer)
    chunks = []
    while True:
        data = os.read(reader, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(reader)
    os.waitpid(pid, 0)
    print(b"".join(chunks).decode(), end="", flush=True)


if __name__ == "__main__":
    main()
