"""The process model: who forks whom, who signals whom, and when.

boot        the start-up sequence, in the order that keeps memory shared
master      spawns, reaps and recycles workers (-w N)
worker      what runs in a worker after fork
single      one process serving, no fork (-w 0)
supervisor  what the master becomes after its first reload
handover    the reload state machine: pure decisions, events in, actions out
reload      the mechanics of a reload: start a generation, exec the supervisor
signals     which signal does what; handlers that only enqueue
scoreboard  shared memory where workers report heartbeat and request counts
sockets     bind, listen, describe and adopt listening sockets
systemd     sd_notify
privileges  --user/--group
procname    process titles
"""
