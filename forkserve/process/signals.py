"""Every signal forkserve handles, declared once, and a queue that handlers only append to.

`SIGNALS` says what each signal does with -w N (the master), with -w 0 (the
single-process server) and after a reload (the master or single server has
become the supervisor of generations); docs/signals.md's table is
generated from it (`python -m forkserve.process.signals`), and a test fails
when they drift. Every process that handles signals has one
`handle_<name>()` method per signal it installs (`handler_name`).

Signal handlers run between two bytecodes of whatever the process was doing,
so they do nothing but record the signal and wake the loop; the loop then
calls the `handle_<name>()` method. Tests push signals into the queue
directly.
"""

import dataclasses
import os
import signal
import sys

__all__ = ["SIGNALS", "MASTER_SIGNALS", "SINGLE_SIGNALS", "SignalQueue", "handler_name",
           "hold", "release", "on_hub", "signals_table", "wake"]


@dataclasses.dataclass(frozen=True)
class Signal:
    signum: int
    #: what the master does (-w N)
    workers: str
    #: what the single-process server does (-w 0); None: not handled there
    single: str | None
    #: what the supervisor does, once a reload happened
    supervisor: str
    #: False for a signal only workers handle: the master installs no handler
    #: for it (so it needs no handle_<name>() method)
    master: bool = True

    @property
    def name(self):
        return signal.Signals(self.signum).name[3:]


SIGNALS = (
    Signal(signal.SIGTERM,
           workers="graceful stop: stop accepting, let in-flight requests finish (up to "
                   "`--graceful-timeout`), exit 0",
           single="the same, in the one process",
           supervisor="graceful stop of every generation (a starting one too), exit 0"),
    Signal(signal.SIGINT, workers="fast stop: workers exit at once", single="fast stop",
           supervisor="fast stop of every generation"),
    Signal(signal.SIGQUIT, workers="fast stop (as INT)", single="fast stop",
           supervisor="fast stop of every generation"),
    Signal(signal.SIGHUP,
           workers="reload: a new generation (a fresh interpreter: new code, new data) starts "
                   "on the same sockets; once it serves, the workers drain (up to "
                   "`--graceful-timeout`) and the master becomes its supervisor, same PID. "
                   "Memory holds both generations meanwhile. A HUP during a reload is done "
                   "once it is over",
           single="reload, as with `-w N`: once the new generation serves, this process "
                  "drains and becomes its supervisor, same PID",
           supervisor="reload: generation N+1 starts; once it serves, generation N drains "
                      "(and is stopped after `--graceful-timeout`)"),
    Signal(signal.SIGUSR2, workers="the same as HUP (Gunicorn upgrades its binary on USR2; "
                                   "forkserve's reload already starts a new interpreter, "
                                   "under the same PID)",
           single="the same as HUP", supervisor="the same as HUP"),
    Signal(signal.SIGTTIN, workers="one worker more; during a reload, one more for the "
                                   "incoming generation once it serves",
           single="logged and ignored (no workers)",
           supervisor="passed to the serving generation; during a reload, to the incoming one "
                      "once it serves"),
    Signal(signal.SIGTTOU, workers="one worker fewer (never below one); during a reload, one "
                                   "fewer for the incoming generation once it serves",
           single="logged and ignored (no workers)",
           supervisor="passed to the serving generation; during a reload, to the incoming one "
                      "once it serves"),
    Signal(signal.SIGUSR1, workers="reopen log files (for logrotate), in every worker too",
           single="reopen log files", supervisor="reopen log files, in every generation too"),
    Signal(signal.SIGCHLD, workers="a worker exited: reap it, replace it if needed", single=None,
           supervisor="a generation exited: reap it; if it was serving, start a new one"),
    Signal(signal.SIGABRT,
           workers="not for the master: it sends ABRT to a worker stuck past `--timeout` when "
                   "a `worker_abort` hook is installed; the worker runs the hook and exits "
                   "(KILL follows a second later). Without the hook the master sends KILL",
           single=None, supervisor="not handled", master=False),
)

#: signals the master and the supervisor install handlers for
MASTER_SIGNALS = tuple(spec.signum for spec in SIGNALS if spec.master)
#: signals the single-process server installs handlers for (a new
#: generation's exit is found by its loop, not by SIGCHLD)
SINGLE_SIGNALS = tuple(spec.signum for spec in SIGNALS
                       if spec.master and spec.single is not None)


def signals_table() -> str:
    """docs/signals.md's Signals table, in Markdown."""
    lines = ["| Signal | Master (`-w N`) | Single process (`-w 0`) | After a reload (supervisor) |",
             "|---|---|---|---|"]
    for spec in SIGNALS:
        lines.append(f"| {spec.name} | {spec.workers} | {spec.single or 'not handled'} "
                     f"| {spec.supervisor} |")
    lines.append("| WINCH | ignored, daemonized or not (Gunicorn, daemonized, stops its "
                 "workers on it; send TTOU instead) | ignored | ignored |")
    return "\n".join(lines)


def hold():
    """Block the server's signals until its handlers are installed (`release`).

    From the moment the server listens (and writes its pid file) a signal
    must not meet the default action, which would kill the master without
    cleaning up; a blocked signal stays pending and arrives on release.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, MASTER_SIGNALS)


def release():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, MASTER_SIGNALS)


def handler_name(signum) -> str:
    """SIGTTIN -> 'handle_ttin'."""
    return "handle_" + signal.Signals(signum).name[3:].lower()


def on_hub(signum, handler):
    """A `SignalQueue.install` setter for a process whose gevent hub serves (a
    worker, the single server): the handler runs on the hub, between two
    greenlets, not in a signal context."""
    import gevent

    gevent.signal_handler(signum, handler, signum)


def wake(fd):
    """Write a byte to `fd`, the write end of a loop's wake pipe, without
    blocking: a full pipe already wakes the loop, a closed one (its loop
    exec'd into the supervisor) has none left to wake."""
    try:
        os.write(fd, b".")
    except (BlockingIOError, BrokenPipeError):
        pass


class SignalQueue:
    """Signals recorded by handlers, plus a pipe that wakes a sleeping loop
    (forkserve.process.driver.Loop.wait selects on `wake_r`), in every
    process: the master and the supervisor install their handlers with
    signal.signal, a worker and the single server on their gevent hub
    (`on_hub`). The master's workers keep `wake_w` to wake it too, when
    their scoreboard slot says something it acts on at once (`wake`)."""

    #: How many pending signals are kept; a flood of one signal needs no more.
    limit = 32

    def __init__(self):
        self.pending = []
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def install(self, signals, setter=signal.signal):
        for signum in signals:
            setter(signum, self.push)

    def push(self, signum, frame=None):
        if len(self.pending) < self.limit:
            self.pending.append(signum)
        self.wake()

    def wake(self):
        wake(self.wake_w)

    def pop_all(self):
        pending, self.pending = self.pending, []
        return pending

    def drain_wakeups(self):
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self):
        os.close(self.wake_r)
        os.close(self.wake_w)


if __name__ == "__main__":  # python -m forkserve.process.signals prints docs/signals.md's table
    sys.stdout.write(signals_table() + "\n")
