"""What the master reads about its workers' memory.

--max-worker-memory (recycle a worker whose private memory is over the
limit: anonymous memory, its copies, not the file pages it maps; one at a
time, replacement first), --memory-log-interval, and the report the --stats
endpoint serves. A mixin of Master: it uses the master's
workers, scoreboard and clock.
"""

import logging
import os

from forkserve.memory import reporter

__all__ = ["WorkerMemory"]

log = logging.getLogger("forkserve.error")


class WorkerMemory:
    #: how often private memory is read for --max-worker-memory
    memory_check_interval = 2.0

    def check_worker_memory(self):
        if any(r.state in ("retiring", "stopping") for r in self.workers.values()):
            return  # one recycle at a time
        limit = self.cfg.max_worker_memory * 1024 * 1024
        for record in self.workers.values():
            if record.state != "ready":
                continue
            reading = reporter.read_process(record.pid)
            if reading is not None and reading.private > limit:  # anonymous: copies, not files
                log.warning("Worker %d (pid %d) has %.1f MiB private memory, over "
                            "--max-worker-memory %d MiB; recycling it", record.worker_id,
                            record.pid, reading.private / 2**20, self.cfg.max_worker_memory)
                record.state = "retiring"
                return

    def process_infos(self):
        infos = [reporter.ProcessInfo(pid=os.getpid(), role="master", worker_id=None,
                                    requests=None, generation=self.generation)]
        for record in sorted(self.workers.values(), key=lambda r: (r.number, r.index)):
            slot = self.scoreboard.read(record.index)
            # A retiring worker has handed its number to its replacement.
            leaving = "draining" if record.state in ("retiring", "stopping") else None
            infos.append(reporter.ProcessInfo(pid=record.pid, role="worker",
                                            worker_id=record.worker_id,
                                            requests=slot.requests,
                                            generation=record.generation, state=leaving,
                                            gc_collections=slot.gc_collections,
                                            gc_pause=slot.gc_pause_ns / 1e9,
                                            connections=slot.connections,
                                            accepted=slot.accepted))
        return infos

    def report(self):
        if self.generations.pids:  # first reload: the tree has a generation under us
            return reporter.collect(reporter.discover(os.getpid()))
        return reporter.collect(self.process_infos())

    def log_memory(self):
        interval = self.cfg.memory_log_interval
        now = self.clock()
        if not interval or now < self.next_memory_log:
            return
        self.next_memory_log = now + interval
        reporter.log_report(log, self.report())
