"""Several forkserve instances on one host sharing one store file: total PSS.

    python benchmarks/shared_store.py                    # 100,000 people, 3 x 4 workers
    python benchmarks/shared_store.py --rows 20000 --requests 20000   # quicker
    python benchmarks/shared_store.py --quick      # 5,000 people, 3 x 2 workers

Builds one PersonDB store file, then measures three setups in turn, each
made of independent `python -m forkserve -w 4` instances (separate masters
in separate process groups, as separate containers or systemd units are),
the PersonDB example in store mode, on 127.0.0.1 port 0:

- one instance;
- three instances opening the same store file (what issue 16 asks for:
  their pages are the same page-cache pages);
- three instances, each opening its own copy of the file (what separate
  images or volumes per container cost), for contrast.

Each instance then serves `--requests` random lookups (wrk with
benchmarks/apps/lookup.lua, 5% unknown people, connections re-opened now and
then so every worker serves), and every process of every instance is read
from /proc/PID/smaps_rollup. PSS splits each shared page among the
processes that map it, so the sum over all processes counts every page once:
it is what the host pays; RSS, which counts the shared file pages in every
process, is printed beside it to show how it misleads here. Prints a markdown table with ratios to one
instance, and writes result.json (the harness's schema) in --out.
"""

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness.instances import start_persondb  # noqa: E402
from benchmarks.harness.machine import Conditions, add_common_options, parse_quick  # noqa: E402
from benchmarks.harness.procs import sample_group  # noqa: E402
from benchmarks.harness.results import write_result  # noqa: E402
from benchmarks.harness.wrk import LoadSpec, run_phase  # noqa: E402
from examples.persondb import generate  # noqa: E402
from forkserve.store import Store  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("setup", "setup"), ("processes", "processes"), ("pss", "total PSS", "MiB"),
    ("pss_vs_one", "PSS / one instance", "×"), ("rss", "total RSS", "MiB"),
    ("uss", "total USS", "MiB"),
)


def measure(setup, store_paths, work, args, spec):
    """Start one instance per store path, drive lookups, return the memory figures."""
    instances = []
    try:
        for number, store_path in enumerate(store_paths):
            instances.append(start_persondb(
                ROOT, workers=args.workers, csv_path=work / "people.csv", store_path=store_path,
                log_path=work / f"{setup}-{number}.log", python=args.python))
        for number, instance in enumerate(instances):
            result = run_phase(instance.url, spec, args.requests, 600, str(work), phase_id=number)
            if result.errors:
                raise SystemExit(f"{setup}, instance {number}: {result.errors} failed requests")
        samples = [sample for instance in instances
                   for sample in sample_group(instance.pid, single=False)]
    finally:
        for instance in instances:
            instance.stop()
    expected = len(store_paths) * (args.workers + 1)
    if len(samples) != expected:
        raise SystemExit(f"{setup}: read {len(samples)} processes, expected {expected}")
    return {"setup": setup, "instances": len(store_paths), "processes": len(samples),
            "pss": sum(s.pss for s in samples), "rss": sum(s.rss for s in samples),
            "uss": sum(s.uss for s in samples)}


QUICK = {"rows": 5000, "requests": 5000, "workers": 2}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="PersonDB rows")
    parser.add_argument("--requests", type=int, default=None,
                        help="random lookups per instance (default: --rows)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "shared_store"),
                        help="where result.json goes (%(default)s)")
    add_common_options(parser, QUICK)
    args = parse_quick(parser, argv, QUICK)
    conditions = Conditions()
    args.requests = args.requests or args.rows

    with tempfile.TemporaryDirectory(prefix="forkserve-shared-store-") as work:
        work = Path(work)
        generate.generate_file(str(work / "people.csv"), args.rows)
        generate.generate_file(str(work / "emails.txt"), args.rows, only_emails=True)
        shared = work / "people.fsdb"
        Store.from_csv(work / "people.csv", "email", shared).close()
        copies = []
        for number in range(args.instances):
            copies.append(work / f"people-copy{number}.fsdb")
            shutil.copyfile(shared, copies[-1])
        spec = LoadSpec(emails_path=str(work / "emails.txt"), cpus=None)
        results = [
            measure("one instance", [shared], work, args, spec),
            measure(f"{args.instances} instances, one shared store file",
                    [shared] * args.instances, work, args, spec),
            measure(f"{args.instances} instances, a copy of the file each", copies,
                    work, args, spec),
        ]
        store_mb = shared.stat().st_size / MIB
        csv_mb = (work / "people.csv").stat().st_size / MIB

    print(f"PersonDB, {args.rows:,} people ({csv_mb:,.0f} MiB CSV, store file "
          f"{store_mb:,.0f} MiB); forkserve -w {args.workers} per instance; "
          f"{args.requests:,} random lookups per instance, then smaps_rollup of every process")
    print()
    print("| setup | processes | total PSS | PSS / one instance | total RSS | total USS |")
    print("|---|---:|---:|---:|---:|---:|")
    one = results[0]["pss"]
    for result in results:
        result["pss_vs_one"] = result["pss"] / one
        print(f"| {result['setup']} | {result['processes']} | {result['pss'] / MIB:,.1f} MiB "
              f"| {result['pss'] / one:.2f}x | {result['rss'] / MIB:,.1f} MiB "
              f"| {result['uss'] / MIB:,.1f} MiB |")
    write_result("shared_store.py", argv, results, conditions, args.out,
                 title=f"{args.rows:,} people, {args.instances} instances x "
                 f"{args.workers} workers",
                 note=f"CSV {csv_mb:,.0f} MiB, store file {store_mb:,.0f} MiB; "
                 f"{args.requests:,} random lookups per instance.")


if __name__ == "__main__":
    main()
