"""The process model: who forks whom, who signals whom, and when.

boot           the start-up sequence, in the order that keeps memory shared
progress       log lines while a long application import runs
env_settings   raw_env, pythonpath, umask: the process setup Gunicorn users set
master         spawns, reaps and recycles workers (-w N), carries out its reload, watches memory
threads        warns when the master has other threads alive as it forks a worker
lifecycle      the workers' lifecycle: pure decisions (fork, signal, halt), events in
worker         what runs in a worker after fork
boot_errors    where a worker leaves the error that stopped it booting, for the master
gevent_servers what a serving process is built from (preload, its HTTP servers)
single         one process serving, no fork (-w 0)
supervisor     what the master becomes after its first reload
handover       the reload state machine: pure decisions, events in, actions out
actions        what the pure decisions (lifecycle, handover) ask for: one vocabulary
stop_state     a process's one stop state: its mode, handed over, halting
driver         the loop every process runs (a worker's too), what the master, the
               single server and the supervisor share, and the one place that
               carries out actions
generations    the I/O half of a reload: generation processes, and the driver
generation_protocol  how a generation starts and adopts the listeners, and how a
               master becomes a supervisor
source_watch   --reload and --touch-reload: a reload when a watched file changes
hooks          Gunicorn's server hooks, with Gunicorn's names and arguments
signals        which signal does what; handlers that only enqueue
scoreboard     shared memory where workers report heartbeat and request counts
sockets        bind, listen, describe and adopt listening sockets; the protocol each speaks
systemd        sd_notify and socket activation
privileges     --user/--group
procname       process titles, set again only when they change
unpatched      os/select functions as they were before gevent patched them
"""
