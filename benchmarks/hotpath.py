"""Where a forkserve worker's time goes per request: CPU, syscalls, Python.

    python benchmarks/hotpath.py                 # forkserve -w 0, hello app, 10 s windows
    python benchmarks/hotpath.py --quick         # 4 s windows
    python benchmarks/hotpath.py --workers 4 --app examples.persondb.app:app --path /health
    python benchmarks/hotpath.py --extra='--access-logfile /dev/null'   # with an access log

Starts ``python -m forkserve -w N`` on the app (pinned to --server-cpus) and
keeps it saturated with wrk (64 keep-alive connections, on --client-cpus)
through four separate windows of the same length, one tool per window so
no tool's overhead lands in another's figures:

1. plain: CPU seconds of the server's processes (/proc/PID/stat) per
   response; the scale for everything below;
2. perf stat on the syscall tracepoints of every server process, or
   strace -c -f where perf cannot: syscalls per response;
3. py-spy record on the process that serves (-w 0) or on one worker,
   --nonblocking by default (--spy-blocking pauses it per sample instead).
   Neither is exact: on a saturated server that nothing else preempts,
   --nonblocking fails to read many of its samples, and not at random;
   the blocking mode stops the process at syscall boundaries and so
   over-counts the frames around syscalls.
   The page gives py-spy's sample and error counts; check the shares
   against perf's kernel share (4.). Each sample's stack is put
   in the first category, from the innermost frame outwards, whose rule
   matches (CATEGORIES); share x CPU per response = microseconds per
   response (an estimate: sampling, plus time the thread was preempted is
   spread over what it was doing);
4. perf record -g (cpu-clock, if perf works here): the share of kernel,
   interpreter and each C extension, and the hottest C symbols.

Writes hotpath.md (the tables) and the raw tool outputs into --out. Needs
wrk, py-spy (pip install py-spy) and perf or strace.
"""

import argparse
import collections
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import procs, wrk  # noqa: E402
from benchmarks.harness.machine import (  # noqa: E402
    Conditions, cpu_list, machine, say, stop_on_signals,
)
from benchmarks.harness.servers import HELLO_APP, REPO  # noqa: E402
from benchmarks.harness.start import all_cpus, start  # noqa: E402

#: (category, pattern matched against one py-spy frame "function (file:line)").
#: A sample goes to the first category, innermost frame first, with a match;
#: the order of this table breaks ties within one frame only.
CATEGORIES = (
    ("getsockopt(SO_SNDBUF) in gevent's sendall", r"getsockopt"),
    ("send: write(2) in Transport.send (gevent sendall for a short write)",
     r"^(Transport\.send|SocketMixin\.send|SocketMixin\.sendall|_sendall|__send_chunk) "),
    ("recv: read(2) and its buffer (transport.Reader)",
     r"^(Reader\.\w+|SocketMixin\.recv_into|SocketMixin\.recv|SocketIO\.readinto) "),
    ("the application", r"\(benchmarks/hello_app\.py|\(examples/"),
    ("request line + header grammar (h1.py)", r"\(forkserve/http/h1\.py"),
    ("start_response + response head (responder.py, response.py)",
     r"^(Responder\.(start_response|_send_head|write)|Connection\.(response_\w+)|plan_head|"
     r"encode_head|check_start_response|Server\.http_date) "),
    ("forwarded_allow_ips, PROXY protocol (proxy.py)", r"\(forkserve/http/proxy\.py|ipaddress\.py"),
    ("send timer: Transport.guarded", r"^Transport\.guarded "),
    ("per-request stats: on_request, scoreboard", r"_count_request|scoreboard\.py|handover\.py"),
    ("access log", r"log_access|accesslog\.py|logging/"),
    ("head parsing + environ (protocol.py head, environ.py)",
     r"^(Connection\.(_next_head|_head_line|_head_done|next_event|receive_data)|Request\.__init__|"
     r"request_environ) "),
    ("request loop: _next_request, _receive_head, respond, yield every 16",
     r"^(Handler\.(_next_request|_receive_head)|Responder\.respond|"
     r"Connection\.start_next_cycle) |^sleep \(gevent/hub"),
    ("new connection: accept, Handler.__init__, close",
     r"^(Handler\.__init__|Responder\.__init__|Connection\.__init__|Transport\.(__init__|close)|"
     r"Handler\.handle |Server\.(_serve|_accept_loop)|.*accept)"),
    ("gevent hub: loop, switches, callbacks", r"\(gevent/(hub|_hub_primitives|_waiter|"
                                              r"_greenlet_primitives|greenlet)\.py|^Hub\."),
    # Last, so that a rewritten handler's functions land here until rules
    # name them; the innermost-frames table needs no rules at all.
    ("forkserve/http, not matched by a rule above", r"\(forkserve/http/"),
    ("gevent, not matched by a rule above", r"\(gevent/"),
)
#: Seconds a tool gets to attach before wrk starts (the server idles meanwhile).
TOOL_ATTACH_S = 1.0

_COMPILED = tuple((name, re.compile(pattern)) for name, pattern in CATEGORIES)
OTHER = "other"


def categorize(stack):
    """The category of one sample: ``stack`` is frames outermost first."""
    for frame in reversed(stack):
        for name, pattern in _COMPILED:
            if pattern.search(frame):
                return name
    return OTHER


def parse_pyspy_raw(text):
    """[(frames outermost first, count)] from py-spy's --format raw output."""
    samples = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            samples.append((stack.split(";"), int(count)))
    return samples


def category_shares(samples):
    """{category: share of samples}, largest first."""
    totals = collections.Counter()
    for stack, count in samples:
        totals[categorize(stack)] += count
    everything = sum(totals.values()) or 1
    return {name: n / everything for name, n in totals.most_common()}


def leaf_shares(samples, top=25):
    """[(innermost frame, share)] of the ``top`` innermost frames."""
    totals = collections.Counter()
    for stack, count in samples:
        totals[stack[-1]] += count
    everything = sum(totals.values()) or 1
    return [(frame, n / everything) for frame, n in totals.most_common(top)]


_STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:(\d+)\s+)?(\w+)\s*$")


def parse_strace_summary(text):
    """{syscall: (calls, errors)} from strace -c's table."""
    rows = {}
    for line in text.splitlines():
        match = _STRACE_ROW.match(line)
        if match and match.group(3) != "total":
            rows[match.group(3)] = (int(match.group(1)), int(match.group(2) or 0))
    return rows


def parse_perf_stat_syscalls(text):
    """{syscall: (calls, None)} from perf stat -x, -e 'syscalls:sys_enter_*'
    (tracepoint counters: exact counts, no errors)."""
    rows = {}
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].isdigit() and \
                fields[2].startswith("syscalls:sys_enter_"):
            name = fields[2][len("syscalls:sys_enter_"):]
            rows[name] = (rows.get(name, (0, None))[0] + int(fields[0]), None)
    return rows


# -- running the tools -----------------------------------------------------------------


def start_server(args, log_dir, env):
    return start([args.python, "-m", "forkserve", "-w", str(args.workers), "-b", "127.0.0.1:0",
                  *shlex.split(args.extra), args.app],
                 log_path=os.path.join(log_dir, "forkserve.log"), env=env,
                 cpus=args.server_cpus or all_cpus(), processes=1 + args.workers,
                 probe_path=args.path)


def context_switches(pgid):
    """(voluntary, involuntary) context switches so far of group ``pgid``'s processes."""
    voluntary = involuntary = 0
    for pid in procs.group_members(pgid):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        involuntary += int(line.split()[1])
        except FileNotFoundError:
            continue  # exited meanwhile
    return voluntary, involuntary


def load_window(url, args, workdir, during=None):
    """Run wrk for --duration s (``during`` starts a tool first and stops it
    after); (wrk's PhaseResult, CPU seconds of the server)."""
    tool = during() if during else None
    if tool is not None:
        # The tools print nothing when attached; give them a moment, in
        # which the server is idle, so that the window's first requests count.
        time.sleep(TOOL_ATTACH_S)
    try:
        before = procs.group_cpu_seconds(args.pgid)
        text = wrk.run(url, args.duration, args.connections, args.client_cpus, workdir)
        cpu = procs.group_cpu_seconds(args.pgid) - before
    finally:
        if tool is not None:
            tool.send_signal(signal.SIGINT)
            try:
                tool.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass  # Group.__exit__ kills it
            tool.stop(grace=5)
    return wrk.parse_result(text), cpu


def pinned(argv, cpus):
    return ["taskset", "-c", cpus] + argv if cpus else argv


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/hotpath.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 s windows instead of 10 s")
    p.add_argument("--duration", type=int, help="seconds per window (10, --quick 4)")
    p.add_argument("--workers", type=int, default=0, help="forkserve -w (default 0)")
    p.add_argument("--app", default=HELLO_APP, help=f"WSGI app (default {HELLO_APP})")
    p.add_argument("--path", default="/", help="the URL path wrk requests (default /)")
    p.add_argument("--extra", default="", help="more forkserve arguments, e.g. "
                                               "--extra='--access-logfile /dev/null'")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second (250)")
    p.add_argument("--spy-blocking", action="store_true",
                   help="let py-spy pause the server for each sample (see the docstring)")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "forkserve-hotpath"))
    args = p.parse_args(argv)
    if args.duration is None:
        args.duration = 4 if args.quick else 10
    missing = [tool for tool in ("wrk", "py-spy") if not _which(tool, args.python)]
    if not (shutil.which("perf") or shutil.which("strace")):
        missing.append("perf or strace")
    if missing:
        p.error(f"needs {', '.join(missing)} (apt-get install wrk strace linux-perf; "
                "pip install py-spy)")
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    if args.client_cpus:
        os.sched_setaffinity(0, cpu_list(args.client_cpus))
    with stop_on_signals():
        page = profile(args)
    with open(os.path.join(args.out, "hotpath.md"), "w") as f:
        f.write(page)
    print(page)
    say(f"results in {args.out}")
    return 0


def _which(tool, python):
    if tool == "py-spy":
        return os.path.exists(os.path.join(os.path.dirname(python), "py-spy")) or \
            shutil.which("py-spy")
    return shutil.which(tool)


def _pyspy(python):
    local = os.path.join(os.path.dirname(python), "py-spy")
    return local if os.path.exists(local) else shutil.which("py-spy")


def profile(args):
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    measured = Conditions()
    server = start_server(args, os.path.join(args.out, "logs"), env)
    args.pgid = server.pid
    url = server.url + args.path
    out = args.out
    with server, tempfile.TemporaryDirectory(prefix="forkserve-hotpath-") as workdir:
        members = server.members()
        target = members[-1] if args.workers else server.pid  # a worker, or the one process
        wrk.run(url, 2, args.connections, args.client_cpus, workdir)  # warm up
        switches_before = context_switches(server.pid)
        plain, plain_cpu = load_window(url, args, workdir)
        switches = [after - before for after, before
                    in zip(context_switches(server.pid), switches_before)]
        cpu_per_req_us = plain_cpu / plain.responses * 1e6
        say(f"plain: {plain.rate:,.0f} req/s, {cpu_per_req_us:.1f} µs CPU per response")

        traced, syscalls, tracer = syscall_window(url, args, workdir, members, out)
        say(f"{tracer}: {traced.responses:,} responses")

        spy_out = os.path.join(out, "py-spy.raw.txt")
        _, _ = load_window(url, args, workdir, during=lambda: procs.Group(pinned(
            [_pyspy(args.python), "record", *([] if args.spy_blocking else ["--nonblocking"]),
             "-r", str(args.rate), "-f", "raw",
             "-o", spy_out, "-p", str(target), "-d", str(args.duration + 5)],
            args.client_cpus), log_path=os.path.join(out, "logs", "py-spy.log")))
        with open(spy_out) as f:
            samples = parse_pyspy_raw(f.read())
        spy_summary = _last_line(os.path.join(out, "logs", "py-spy.log"), "Samples:")
        say(f"py-spy: {sum(n for _, n in samples):,} samples; {spy_summary}")

        perf_text = perf_window(url, args, workdir, target, out)
    conditions = f"{machine()}; {measured.describe()}"
    conditions += (f"; in the plain window the server's processes were switched out "
                   f"{switches[0] / plain.responses:.3f} times per response voluntarily "
                   f"(waiting) and {switches[1] / plain.responses:.3f} involuntarily "
                   "(preempted: other processes of the machine, or the other workers)")
    return render(args, plain, cpu_per_req_us, traced, syscalls, tracer, samples, spy_summary,
                  perf_text, conditions)


def syscall_window(url, args, workdir, members, out):
    """Syscall counts of every server process over one window:
    (wrk's result, {syscall: (calls, errors or None)}, the tool used).
    perf stat on the syscall tracepoints (exact counts, little overhead)
    where it works, else strace -c (ptrace: it slows the server many times
    over, but its counts, with errors, stay exact)."""
    pids = ",".join(map(str, members))
    if perf_works():
        path = os.path.join(out, "perf-stat-syscalls.csv")
        argv = ["perf", "stat", "-e", "syscalls:sys_enter_*", "-x,", "-o", path, "-p", pids]
        parse = parse_perf_stat_syscalls
    else:
        path = os.path.join(out, "strace.txt")
        argv = ["strace", "-c", "-f", "-o", path]
        argv += [arg for pid in members for arg in ("-p", str(pid))]
        parse = parse_strace_summary
    result, _ = load_window(url, args, workdir, during=lambda: procs.Group(
        pinned(argv, args.client_cpus), log_path=os.path.join(out, "logs", argv[0] + ".log")))
    with open(path) as f:
        return result, parse(f.read()), " ".join(argv[:4])


def perf_works():
    if not shutil.which("perf"):
        return False
    proc = subprocess.run(["perf", "stat", "-e", "syscalls:sys_enter_close", "--", "true"],
                          capture_output=True)
    return proc.returncode == 0


def _last_line(path, marker):
    """The last line of ``path`` containing ``marker`` (py-spy's sample and error counts)."""
    with open(path, errors="replace") as f:
        found = [line.strip() for line in f if marker in line]
    return found[-1] if found else f"no '{marker}' line in {path}"


def perf_window(url, args, workdir, target, out):
    """perf's per-DSO and per-symbol shares, or why there are none."""
    if not shutil.which("perf"):
        return "perf is not installed (apt-get install linux-perf)."
    data = os.path.join(out, "perf.data")
    load_window(url, args, workdir, during=lambda: procs.Group(pinned(
        ["perf", "record", "-F", "999", "-g", "-o", data, "-p", str(target)], args.client_cpus),
        log_path=os.path.join(out, "logs", "perf.log")))
    sections = []
    for sort in ("dso", "dso,sym"):
        proc = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", sort,
                               "--stdio", "-g", "none", "--percent-limit", "0.7"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            return f"perf report failed: {proc.stderr.strip()[-500:]}"
        rows = [line for line in proc.stdout.splitlines() if line.strip()
                and not line.startswith("#")]
        sections.append(f"perf report --sort {sort} (self time, ≥ 0.7%):\n\n```\n"
                        + "\n".join(rows[:40]) + "\n```\n")
    return "\n".join(sections)


def render(args, plain, cpu_us, traced, syscalls, tracer, samples, spy_summary, perf_text,
           conditions):
    lines = [f"# forkserve hot path: {args.app}, forkserve -w {args.workers} {args.extra}\n",
             f"- command: `python benchmarks/hotpath.py {' '.join(sys.argv[1:])}`",
             f"- conditions: {conditions}",
             f"- plain window: {plain.responses:,} responses in {plain.duration_s:.1f} s "
             f"({plain.rate:,.0f} req/s), **{cpu_us:.1f} µs CPU per response** (all "
             "server processes, user + system)", ""]
    accepted = syscalls.get("accept4", (0, 0))[0]
    lines += [f"## Syscalls per response ({tracer}, all server processes)\n",
              f"{traced.responses:,} responses while traced, on {accepted:,} accept4 calls "
              f"(wrk opens {args.connections} per window; the per-connection "
              "syscalls, accept4, fcntl, ioctl, getsockname, epoll_ctl, close, are that "
              "count divided by the responses).\n",
              "| syscall | per response | errors per response |", "|---|---:|---:|"]
    per = max(traced.responses, 1)
    for name, (calls, errors) in sorted(syscalls.items(), key=lambda kv: -kv[1][0]):
        if calls / per >= 0.001:
            failed = "—" if errors is None else f"{errors / per:.3f}"
            lines.append(f"| {name} | {calls / per:.3f} | {failed} |")
    total = sum(calls for calls, _ in syscalls.values())
    lines += [f"| **total** | **{total / per:.2f}** | |", ""]
    shares = category_shares(samples)
    n = sum(count for _, count in samples)
    lines += ["## Where the time goes (py-spy, categories)\n",
              f"{n:,} samples of {'the single process' if not args.workers else 'one worker'} "
              f"(py-spy: {spy_summary.removeprefix('py-spy> ')})"
              "; µs per response = share × the plain window's CPU per response. Rules: "
              "benchmarks/hotpath.py CATEGORIES."
              + (" With workers sharing a CPU, a worker waiting for the CPU is sampled where "
                 "it waits (mostly in the hub), so these shares are wall-clock, not CPU: "
                 "read the breakdown from a -w 0 run." if args.workers else "") + "\n",
              "| category | share | µs per response |", "|---|---:|---:|"]
    for name, share in shares.items():
        lines.append(f"| {name} | {share:.1%} | {share * cpu_us:.1f} |")
    lines += ["", "## Innermost Python frames (py-spy, top 25)\n",
              "| frame | share | µs per response |", "|---|---:|---:|"]
    for frame, share in leaf_shares(samples):
        lines.append(f"| `{frame}` | {share:.1%} | {share * cpu_us:.1f} |")
    lines += ["", "## C level (perf)\n", perf_text, ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
