"""Which signal does what, and a queue that handlers only append to.

Signal handlers run between two bytecodes of whatever the process was doing,
so they do nothing but record the signal and wake the loop; the loop then
calls one `handle_<name>()` method per signal. Tests push signals into the
queue directly.
"""

import os
import signal

__all__ = ["MASTER_SIGNALS", "SignalQueue", "handler_name", "hold", "release"]

#: signal -> what the master does. The table is the documentation: the
#: README's signal section is written from it.
MASTER_SIGNALS = {
    signal.SIGTERM: "graceful stop: stop accepting, finish in-flight requests "
                    "(up to --graceful-timeout), exit 0",
    signal.SIGINT: "fast stop: workers exit at once",
    signal.SIGQUIT: "fast stop: workers exit at once",
    signal.SIGHUP: "restart every worker gracefully (new workers first, then the old drain)",
    signal.SIGTTIN: "one worker more",
    signal.SIGTTOU: "one worker fewer (never below one)",
    signal.SIGUSR1: "reopen log files (for logrotate)",
    signal.SIGCHLD: "a worker exited: reap it and replace it if needed",
}


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


class SignalQueue:
    """Signals recorded by handlers, plus a pipe that wakes a sleeping loop."""

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
        try:
            os.write(self.wake_w, b".")
        except BlockingIOError:
            pass  # the pipe is full, so the loop is already going to wake

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
