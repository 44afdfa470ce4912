"""The conditions a figure was measured in: the machine, the versions, the
load average and the CPU steal over the run; and the scenarios' shared
plumbing (progress lines, signals, CPU lists).

The machine is shared (a 2-core VM, other work on it), so every figure is
given with what else was going on: `Conditions` reads the load average and
/proc/stat's steal column when a run starts and again when it ends.
"""

import contextlib
import json
import os
import platform
import signal
import subprocess
import sys

from benchmarks.harness.servers import REPO
from benchmarks.harness.wrk import version as wrk_version

__all__ = ["Conditions", "add_common_options", "add_quick_option", "cpu_list", "cpu_times",
           "machine", "parse_quick", "say", "stop_on_signals", "versions"]


def cpu_times(stat="/proc/stat"):
    """(steal, total) jiffies of all CPUs so far, from /proc/stat's "cpu" line."""
    with open(stat) as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[7], sum(fields[:8])


class Conditions:
    """The load average and CPU steal from construction to `end()`."""

    def __init__(self):
        self.load_before = os.getloadavg()[0]
        self._steal_before = cpu_times()
        self.load_after = self.steal = None

    def end(self):
        """Take the readings at the end of the run; returns self."""
        steal, total = cpu_times()
        self.steal = (steal - self._steal_before[0]) / max(total - self._steal_before[1], 1)
        self.load_after = os.getloadavg()[0]
        return self

    def describe(self):
        if self.steal is None:
            self.end()
        return (f"load average {self.load_before:.2f} before / {self.load_after:.2f} after; "
                f"CPU steal during the run {self.steal:.1%} (all CPUs, /proc/stat)")

    def as_dict(self):
        if self.steal is None:
            self.end()
        return {"load_before": round(self.load_before, 2), "load_after": round(self.load_after, 2),
                "steal": round(self.steal, 4)}


def machine():
    model = "?"
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    return f"{os.cpu_count()} × {model}, Linux {platform.release()}"


def versions(python, extra=()):
    """Versions of everything measured, read in the servers' interpreter."""
    code = (
        "import importlib.metadata as m, json, platform, sys, forkserve\n"
        "out = {'python': platform.python_version(), 'forkserve': forkserve.__version__}\n"
        "for name in ('gevent', 'greenlet', 'gunicorn', 'pyuwsgi', 'bottle', 'orjson',"
        " *sys.argv[1:]):\n"
        "    try: out[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: out[name] = 'not installed'\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([python, "-c", code, *extra], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=60)
    found = json.loads(proc.stdout) if proc.returncode == 0 else {"forkserve": "not importable"}
    found["wrk"] = wrk_version()
    return found


def say(message):
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def stop_on_signals():
    """Turn SIGTERM/SIGHUP into SystemExit so every `with Group` cleans up."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def add_common_options(parser, quick):
    """--python (the servers' interpreter) and --quick, which sets ``quick``'s
    options ({dest: value}) where the command line did not; parse with
    parse_quick."""
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter the servers run on, with forkserve installed "
                             "(default: this one); heap sharing needs Python 3.12+")
    add_quick_option(parser, quick)


def add_quick_option(parser, quick):
    parser.add_argument("--quick", action="store_true", help="a smoke run: " + ", ".join(
        f"--{key.replace('_', '-')} {value}" for key, value in quick.items()))


def parse_quick(parser, argv, quick):
    """parser.parse_args(argv), with --quick's settings for the options left at
    their defaults (an option given on the command line wins)."""
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in quick.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    return args


def cpu_list(text):
    """taskset's "0,2-3" as [0, 2, 3]."""
    cpus = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus
