"""The master's side of a reload: forkserve.process.handover decides, these
carry it out.

A mixin of Master (it uses the master's clock, workers, generations,
handover, listeners and queue): the new generation's ready byte and the
clock go to the hand-over; when the new generation serves, the master's own
workers are retired (each with its SIGKILL deadline) and, once they are
gone, the master execs into the supervisor.
"""

import logging
import signal

from forkserve.process import procname, reload

__all__ = ["MasterReload"]

log = logging.getLogger("forkserve.error")


class MasterReload:
    #: the generation the master's title says serves, while it is not its own
    _titled_serving = None

    def check_reload(self):
        self.follow_generations()
        if self.handover.retiring == self.generation and not self.workers:
            self.apply(self.handover.gone(self.generation, "drained", self.clock()))
        if self._titled_serving is not None and self.handover.serving == self.generation:
            # the new generation died while ours drained: ours serves again
            self._titled_serving = None
            procname.set_title(self.cfg, "master", self.app_name)

    def retire(self, number):
        if number == self.generation:
            self.hooks.pre_retire(self.generation)
            # `forkserve memory --pid` reads from the title which generation serves
            self._titled_serving = self.handover.serving
            procname.set_title(self.cfg, "master", self.app_name,
                               f"serving generation {self.handover.serving}")
            # each with its own SIGKILL deadline: the hand-over's ends if
            # the new generation dies meanwhile
            self.carry_out(self.lifecycle.drain(self.clock()))
        else:
            self.generations.signal(number, signal.SIGTERM)

    def kill_own_workers(self):
        # murder() SIGKILLs each retired worker at its own deadline (and
        # clears it); this catches any still waiting for theirs.
        self.carry_out(self.lifecycle.kill_draining(self.generation))

    def become_supervisor(self, action):
        reload.exec_supervisor(self.cfg, self.app_name, self.generations.pid(action.number),
                               action.number, self.listeners,
                               self.stats.listener if self.stats else None,
                               reload_again=action.reload_again, queue=self.queue)
