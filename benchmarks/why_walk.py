"""`forkserve memory --why`'s object walk: the original, the Python and the C walk, on PersonDB's heap.

    python benchmarks/why_walk.py                    # 200,000 people, baseline bda8e95
    python benchmarks/why_walk.py --rows 20000 --rounds 1

This process plays the master: it loads PersonDB's dicts (PERSONDB_MODE=dict),
freezes them as the master does, and forks a "worker" that looks up every
second person (copying their pages). Then, as the auditor does, it reads the
worker's exclusively mapped pages and walks every module global, timing
side by side, alternating, --rounds times each: the walk of --baseline (a
git revision of forkserve/memory/why.py, as the module was named then),
forkserve.memory.copied_objects.walk in
Python (in_c=False) and in C (the extension forkserve.memory._whywalk).
All must find the same objects on the same pages; the script checks that.

Prints the objects walked, each walk's best and median seconds, the ratios,
and the machine's load average and CPU steal over the run (the machine is
shared), and writes them to result.json (the harness's schema) in --out.
"""

import argparse
import functools
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness.machine import Conditions  # noqa: E402
from benchmarks.harness.results import write_result  # noqa: E402
from examples.persondb import app as persondb  # noqa: E402
from examples.persondb.generate import email_for, generate_file  # noqa: E402
from forkserve.memory import copied_objects  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("walk", "walk"), ("best_s", "best"), ("median_s", "median"), ("objects", "objects walked"),
    ("same_result", "same result from all walks"),
)


def baseline_walk(revision):
    source = subprocess.run(["git", "show", f"{revision}:forkserve/memory/why.py"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("why_baseline")
    exec(compile(source, f"{revision}:why.py", "exec"), module.__dict__)
    return module.walk


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default="bda8e95",
                        help="git revision (before the rename to copied_objects.py) whose why.walk is the 'before'")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "why_walk"),
                        help="where result.json goes (%(default)s)")
    args = parser.parse_args(argv)
    if copied_objects._c_walk() is None:
        parser.error("forkserve.memory._whywalk is not built: run `pip install -e .` with a C "
                     "compiler present, and leave FORKSERVE_NO_C unset")
    walks = {"before": baseline_walk(args.baseline),
             "python": functools.partial(copied_objects.walk, in_c=False),
             "c": functools.partial(copied_objects.walk, in_c=True)}
    conditions = Conditions()
    with tempfile.TemporaryDirectory() as scratch:
        csv = os.path.join(scratch, "people.csv")
        generate_file(csv, args.rows)
        globals()["PEOPLE"] = persondb.load_dicts(csv)  # a module global, as in an app
    gc.freeze()
    ready_r, ready_w = os.pipe()
    worker = os.fork()
    if worker == 0:  # the worker: read half the people as the app does, then wait
        people = globals()["PEOPLE"]
        for n in range(0, args.rows, 2):
            dict(people[email_for(0, n)])
        os.write(ready_w, b"x")
        time.sleep(3600)
        os._exit(0)
    try:
        os.read(ready_r, 1)
        page_size = os.sysconf("SC_PAGE_SIZE")
        pages = copied_objects.exclusive_pages(worker, page_size)
        shift = page_size.bit_length() - 1
        first = [__name__]
        times = {name: [] for name in walks}
        results = {}
        for _ in range(args.rounds):
            for name, walk in walks.items():
                started = time.perf_counter()
                roots, counts, walked = walk(first, pages, shift)
                times[name].append(time.perf_counter() - started)
                results[name] = ({page: dict(c) for page, c in counts.items()}, walked)
                del roots, counts
    finally:
        os.kill(worker, 9)
        os.waitpid(worker, 0)
    conditions.end()
    same = results["before"] == results["python"] == results["c"]
    print(f"python {sys.version.split()[0]}, {args.rows:,} people, "
          f"{results['c'][1]:,} objects walked, {len(pages):,} exclusive pages of the "
          f"worker; same result from all walks: {same}")
    for name in walks:
        print(f"{name:>6}: best {min(times[name]):.2f} s, median "
              f"{statistics.median(times[name]):.2f} s over {args.rounds} rounds")
    best = {name: min(seconds) for name, seconds in times.items()}
    print(f"c is {best['before'] / best['c']:.2f}x faster than before ({args.baseline}) and "
          f"{best['python'] / best['c']:.2f}x faster than the Python walk (best of each); "
          + conditions.describe())
    rows = [{"walk": name if name != "before" else f"before ({args.baseline})",
             "best_s": best[name], "median_s": statistics.median(times[name]),
             "objects": results[name][1], "same_result": same} for name in walks]
    write_result("why_walk.py", argv, rows, conditions, args.out,
                 title=f"{args.rows:,} people, {args.rounds} rounds",
                 versions={"python": sys.version.split()[0]},
                 note=f"{len(pages):,} exclusive pages of the worker.")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
