"""The process model: who forks whom, who signals whom, and when.

boot           the start-up sequence, in the order that keeps memory shared
master         spawns, reaps and recycles workers (-w N)
master_memory  what the master reads of its workers' memory (limits, log, stats)
worker         what runs in a worker after fork
serving        what a serving process builds its servers from (preload, make_servers)
single         one process serving, no fork (-w 0)
supervisor     what the master becomes after its first reload
handover       the reload state machine: pure decisions, events in, actions out
generations    the reload's I/O: generation processes, and the actions carried out
reload         how processes hand over: the Role, start a generation, exec the supervisor
signals        which signal does what; handlers that only enqueue
scoreboard     shared memory where workers report heartbeat and request counts
sockets        bind, listen, describe and adopt listening sockets
systemd        socket activation and sd_notify
privileges     --user/--group
procname       process titles
unpatched      os/select/signal functions as they were before gevent patched them
"""
