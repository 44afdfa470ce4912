"""Keeping the master's pages shared, and showing whether they are.

cow       the gc recipe: disable while loading, freeze before fork, never
          collect the frozen heap, leave through os._exit
sharing   forkserve.share(): make a loaded dataset immortal (3.12+)
procfs    pure parsers of /proc/PID/smaps_rollup, smaps and stat
reporter  per-process shared/private memory, as a table, JSON or Prometheus
command   `forkserve memory`, the command-line reporter
"""
