"""The benchmark harness every scenario in benchmarks/ is written on.

- servers: the server registry (PersonDB and hello-world line-ups), each a
  ServerSpec that builds its command line and says why it cannot run here;
  serve_fd.py serves an app on an inherited socket for servers that cannot
  bind port 0 and report it (gevent, waitress, cheroot, bjoern);
- start: start a server in its own process group, wait until it answers
  with all its processes, stop it (Server, ServerFailed);
- procs: process groups and /proc readings (CPU seconds, memory samples);
- wrk: the load driver (counted PersonDB phases, timed runs, several
  servers at once) and a latency probe;
- machine: the conditions of a run (load average, CPU steal, versions);
- datasets: the cached PersonDB dataset;
- results: one result schema, written by each scenario to
  benchmarks/results/<scenario>/result.json;
- index: benchmarks/README.md, generated from the scenarios' docstrings and
  those results (and the table in docs/benchmarks.md).
"""
