"""Which bytes of the master's code objects does a worker write after --share-heap?

    python benchmarks/code_writes.py                # the Flask shop, cold
    python benchmarks/code_writes.py --warmup       # after --warmup's requests in the master

In this process (the "master"): load tests/apps/flask_shop, optionally run
forkserve's warm-up on every page of its client, make the heap immortal
(forkserve.memory.heap.share_heap), and copy the raw bytes of the code
object of every function. Then fork; the child serves every page 5 times
through Flask's test client and compares each code object's bytes with the
copy: how many changed, and whether the changed bytes lie in the object's
header (reference count, fields) or in co_code_adaptive, the bytecode with
its inline caches that specialisation rewrites. Python 3.12+.
"""

import argparse
import ctypes
import gc
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "apps"))

ROUNDS = 5


def raw(obj):
    return ctypes.string_at(id(obj), sys.getsizeof(obj))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--warmup", action="store_true", help="warm the pages up in the master first")
    args = p.parse_args(argv)
    gc.disable()
    from flask_shop import app
    from flask_shop.client import PAGES

    from forkserve.memory import heap
    from forkserve.process import warmup
    if args.warmup:
        warmup.run(app, sorted(set(PAGES)))
    functions = [o for o in gc.get_objects() if isinstance(o, types.FunctionType)]
    codes = list({id(f.__code__): f.__code__ for f in functions}.values())
    print(heap.share_heap())
    before = {id(code): raw(code) for code in codes}
    header = type(codes[0]).__basicsize__ - 2  # co_code_adaptive starts here
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        client = app.test_client()
        for _ in range(ROUNDS):
            for page in PAGES:
                client.get(page)
        changed = in_header = in_code = 0
        for code in codes:
            old, new = before[id(code)], raw(code)
            if old != new:
                changed += 1
                for offset, (a, b) in enumerate(zip(old, new)):
                    if a != b:
                        if offset < header:
                            in_header += 1
                        else:
                            in_code += 1
        os.write(writer, (f"Python {sys.version.split()[0]}, warm-up "
                          f"{'on' if args.warmup else 'off'}: {changed:,} of {len(codes):,} code "
                          f"objects changed; changed bytes: {in_header:,} in headers, {in_code:,} "
                          "in co_code_adaptive\n").encode())
        os._exit(0)
    os.close(writer)
    os.waitpid(pid, 0)
    print(os.read(reader, 4096).decode(), end="")


if __name__ == "__main__":
    main()
