"""Three PersonDB shards behind nginx (examples/deploy): what nginx costs, and
what a rolling reload and a killed instance cost the clients.

    python benchmarks/deploy_nginx.py                 # ~2 minutes on 2 cores
    python benchmarks/deploy_nginx.py --rows 100000 --requests 40000
    python benchmarks/deploy_nginx.py --quick         # 3,000 people and requests

Everything runs on this machine, on loopback: three forkserve instances
(`-w 2`, PERSONDB_MODE=store, PERSONDB_SHARD=i/3) and nginx with
examples/deploy/nginx.conf (one nginx worker), all pinned to CPU 0; wrk
(benchmarks/apps/lookup.lua, no misses, no forced closes) pinned to CPU 1.

1. latency: the same lookups of shard 0's people, straight to shard 0 and
   through nginx, at 1 connection (the hop alone) and at 16; ratios.
2. rolling reload: wrk through nginx at every shard while
   examples/deploy/rolling-reload HUPs the three instances one by one;
   failed requests (non-200 statuses, connect/write errors, timeouts).
3. killed instance: Python clients through nginx at every shard (they
   record each request's shard, status and time); shard 1's process group
   gets SIGKILL, is started again on the same port, and serves again.

Writes result.json (the harness's schema: the latency rows), a Markdown
report and the raw JSON to --out (benchmarks/results/deploy_nginx).
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks.harness.machine import Conditions, add_quick_option, parse_quick  # noqa: E402
from benchmarks.harness.results import write_result  # noqa: E402
from benchmarks.harness.wrk import LoadSpec, run_phase  # noqa: E402
from deploy_cluster import (  # noqa: E402
    Instance, Load, Nginx, emails_by_shard, rolling_reload, start_instances,
)
from forkserve_testing import poll  # noqa: E402

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("connections", "connections"), ("path", "path"), ("rounds", "rounds"), ("rate", "req/s"),
    ("p50_us", "p50"), ("p99_us", "p99"), ("errors", "errors"),
)


def write_emails(path, emails):
    pathlib.Path(path).write_text("".join(f"{email}\n" for email in emails))
    return str(path)


def latency_phase(instances, nginx, shard0_emails, requests, workdir, rounds=3):
    """Direct and through nginx, alternated `rounds` times; the median of each figure."""
    rows = []
    targets = (("direct", f"http://127.0.0.1:{instances[0].port}"),
               ("nginx", f"http://127.0.0.1:{nginx.port}"))
    for connections in (1, 16):
        spec = LoadSpec(emails_path=shard0_emails, connections=connections, miss_ratio=0.0,
                        close_ratio=0.0, cpus="1")
        runs = {name: [] for name, _ in targets}
        for _ in range(rounds):
            for name, url in targets:
                runs[name].append(run_phase(url, spec, requests // rounds, 120, workdir,
                                            phase_id=len(rows) * 10 + len(runs[name])))
        for name, results in runs.items():
            rows.append({"connections": connections, "path": name, "rounds": rounds,
                         "rate": statistics.median(r.rate for r in results),
                         "p50_us": statistics.median(r.p50_us for r in results),
                         "p99_us": statistics.median(r.p99_us for r in results),
                         "errors": sum(r.errors for r in results),
                         "bad_status": sum(r.bad_status for r in results)})
    return rows


def reload_phase(instances, nginx, all_emails, requests, workdir):
    spec = LoadSpec(emails_path=all_emails, connections=8, miss_ratio=0.0, close_ratio=0.0,
                    cpus="1")
    outcome = {}

    def reload_when_loaded():
        time.sleep(1.0)  # let wrk reach a steady state first
        started = time.monotonic()
        completed = rolling_reload(*(i.stats_address for i in instances))
        outcome.update(returncode=completed.returncode, stdout=completed.stdout,
                       stderr=completed.stderr, seconds=time.monotonic() - started,
                       finished_at=time.monotonic())

    thread = threading.Thread(target=reload_when_loaded)
    thread.start()
    result = run_phase(f"http://127.0.0.1:{nginx.port}", spec, requests, 180, workdir,
                       phase_id=100)
    load_ended = time.monotonic()
    thread.join()
    return {"responses": result.responses, "rate": result.rate, "ok": result.ok,
            "bad_status": result.bad_status, "connect_errors": result.connect_errors,
            "write_errors": result.write_errors, "timeouts": result.timeouts,
            "read_errors": result.read_errors, "reload_seconds": outcome["seconds"],
            "reload_within_load": outcome["finished_at"] <= load_ended,
            "reload_returncode": outcome["returncode"], "reload_output": outcome["stdout"]}


def kill_phase(instances, nginx, people, groups, workdir):
    with Load(nginx, [e for group in groups.values() for e in group], threads=3) as load:
        poll(lambda: load.count() > 500, 60, message="load before the kill")
        victim = instances[1]
        killed = time.monotonic()
        victim.kill_group()
        restarted = Instance(1, people, workdir, bind=f"127.0.0.1:{victim.port}").wait_ready()
        instances[1] = restarted
        poll(lambda: nginx.get(f"/person/{groups[1][0]}")[0] == 200, 30, message="shard 1 back")
        back = time.monotonic()
        count = load.count()
        poll(lambda: load.count() > count + 500, 60, message="load after the restart")
    failures = [seconds for _, status, seconds in load.results if status != 200]
    return {"statuses": {str(k): {str(s): n for s, n in v.items()}
                         for k, v in load.statuses().items()},
            "shard1_unavailable_seconds": back - killed,
            "failure_latency_max_ms": 1000 * max(failures) if failures else None,
            "failure_latency_mean_ms": 1000 * sum(failures) / len(failures) if failures else None}


def report(args, latency, reload, kill, steal):
    lines = ["# Three shards behind nginx (benchmarks/deploy_nginx.py)", "",
             f"{args.rows:,} people in 3 shards, forkserve -w 2 per shard, store mode; "
             f"nginx 1 worker; servers and nginx on CPU 0, wrk on CPU 1. "
             f"CPU steal during the run: {steal:.2%}; load average before it: {args.loadavg} "
             f"(other processes shared the machine, so take ratios, not absolute figures).", "",
             "## Latency nginx adds (shard 0's people, wrk, keep-alive)", "",
             f"Direct and through nginx alternated {latency[0]['rounds']} times for each number "
             "of connections; each figure is the median of the rounds.", "",
             "| connections | path | requests/s | p50 µs | p99 µs | errors |",
             "|---|---|---|---|---|---|"]
    for row in latency:
        lines.append(f"| {row['connections']} | {row['path']} | {row['rate']:,.0f} | "
                     f"{row['p50_us']:.0f} | {row['p99_us']:.0f} | {row['errors']} |")
    lines.append("")
    for connections in (1, 16):
        direct, proxied = [r for r in latency if r["connections"] == connections]
        lines.append(f"- {connections} connection(s): nginx adds "
                     f"{proxied['p50_us'] - direct['p50_us']:.0f} µs at p50 "
                     f"(p50 ratio {proxied['p50_us'] / direct['p50_us']:.2f}x, "
                     f"throughput ratio {proxied['rate'] / direct['rate']:.2f}x)")
    lines += ["", "## Rolling reload of the three instances under load", "",
              f"wrk, 8 connections through nginx to every shard: {reload['responses']:,} "
              f"responses at {reload['rate']:,.0f}/s; {reload['ok']:,} were 200. "
              f"Failed: {reload['bad_status']} other statuses, {reload['connect_errors']} "
              f"connect errors, {reload['write_errors']} write errors, {reload['timeouts']} "
              f"timeouts (read errors, counted apart by wrk: {reload['read_errors']}). "
              f"rolling-reload took {reload['reload_seconds']:.1f} s, exit status "
              f"{reload['reload_returncode']}, "
              f"{'within' if reload['reload_within_load'] else 'NOT within'} the load.", "",
              "```", reload["reload_output"].strip(), "```", "",
              "## Shard 1 killed (SIGKILL to its process group) and started again", "",
              "Statuses per shard, Python clients (3 threads) through nginx:", "",
              "```", json.dumps(kill["statuses"], indent=1), "```", "",
              f"Shard 1 unavailable for {kill['shard1_unavailable_seconds']:.1f} s (kill to "
              f"serving again, including its start-up). Its failed requests took at most "
              f"{kill['failure_latency_max_ms']:.1f} ms (mean "
              f"{kill['failure_latency_mean_ms']:.2f} ms).", ""]
    return "\n".join(lines)


QUICK = {"rows": 3000, "requests": 3000}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=30_000)
    parser.add_argument("--requests", type=int, default=30_000,
                        help="wrk responses per latency measurement and for the reload")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "deploy_nginx"))
    parser.add_argument("--only-kill", action="store_true", help="skip phases 1 and 2")
    add_quick_option(parser, QUICK)
    args = parse_quick(parser, argv, QUICK)
    from examples.persondb import generate
    with open("/proc/loadavg") as handle:
        args.loadavg = " ".join(handle.read().split()[:3])
    os.sched_setaffinity(0, {0})  # servers and nginx inherit CPU 0; wrk gets CPU 1
    with tempfile.TemporaryDirectory(prefix="forkserve-deploy-") as workdir:
        people = pathlib.Path(workdir) / "people.csv"
        generate.generate_file(str(people), args.rows, 0)
        groups = emails_by_shard(people)
        shard0 = write_emails(pathlib.Path(workdir) / "shard0.txt", groups[0])
        everyone = write_emails(pathlib.Path(workdir) / "all.txt",
                                [e for g in groups.values() for e in g])
        instances = start_instances(people, workdir)
        nginx = Nginx.for_shards(workdir, [i.port for i in instances], tcp=True).start()
        conditions = Conditions()
        try:
            latency = reload = None
            if not args.only_kill:
                latency = latency_phase(instances, nginx, shard0, args.requests, workdir)
                reload = reload_phase(instances, nginx, everyone, args.requests, workdir)
            kill = kill_phase(instances, nginx, people, groups, workdir)
        finally:
            nginx.stop()
            for instance in instances:
                instance.kill_group()
        steal = conditions.end().steal
    if args.only_kill:
        return
    text = report(args, latency, reload, kill, steal)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "deploy.md").write_text(text)
    write_result("deploy_nginx.py", argv, latency, conditions, str(out),
                 title="three shards behind nginx",
                 note=(f"The rows are the latency phase. Rolling reload: {reload['ok']:,} of "
                       f"{reload['responses']:,} responses 200; shard 1 killed: unavailable "
                       f"for {kill['shard1_unavailable_seconds']:.1f} s; deploy.md has the "
                       "rest."))
    (out / "deploy.json").write_text(json.dumps(
        {"rows": args.rows, "latency": latency, "reload": reload, "kill": kill,
         "steal": steal}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
