"""Keeping the master's pages shared, and showing whether they are.

cow       the gc recipe: disable while loading, freeze before fork, never
          collect the frozen heap, leave through os._exit
sharing   forkserve.share(): make a loaded dataset immortal (3.12+)
walker    share()'s walk in pure Python, for when the C walker did not build
procfs    pure parsers of /proc/PID/smaps_rollup, smaps, stat and titles
model     the report: the server's process tree, private vs file memory
render    the report as a table, log lines or Prometheus text
report_json  the report as JSON and back (stats endpoint, `forkserve memory --stats`)
copied_objects  `forkserve memory --why [TARGET]`: which objects a worker copied
find      which server `forkserve memory` reports: the one named, or every one
workergc  --worker-gc: when workers collect their own cyclic garbage
command   `forkserve memory`, the command-line reporter
"""
