"""Fakes for the drivers' unit tests (test_handover, test_driver_loop): no process."""

import signal


class FakeGenerations:
    def __init__(self):
        self.pids, self.spawned, self.signalled, self.ready = {}, [], [], []

    def spawn(self, number):
        self.pids[number] = 9000 + number
        self.spawned.append(number)

    def waiting_fds(self):
        return []

    def newly_ready(self):
        ready, self.ready = self.ready, []
        return ready

    def signal(self, number, signum):
        self.signalled.append((number, signum))

    def force_out(self, number, hard=False):
        self.signal(number, signal.SIGKILL if hard else signal.SIGQUIT)

    def exited(self, pid):
        for number, known in list(self.pids.items()):
            if known == pid:
                del self.pids[number]
                return number
        return None

    def pid(self, number):
        return self.pids.get(number)
