#!/bin/bash
# usage: prof.sh TREE OUT [wrk -H args...]: cProfile of forkserve -w 0 hello under wrk -c8 for 4 s
TREE=$1; OUT=$2; shift 2
cd $TREE
LOG=$(mktemp)
PROF_OUT=$OUT /work/wt-speed/.venv/bin/python $(dirname $0)/profiling.py -w 0 -b 127.0.0.1:0 ${APP:-benchmarks.hello_app:app} >$LOG 2>&1 &
PID=$!
for i in $(seq 100); do PORT=$(grep -oE '127.0.0.1:[0-9]+' $LOG | head -1 | cut -d: -f2); [ -n "$PORT" ] && break; sleep 0.1; done
wrk -t1 -c8 -d1s "$@" http://127.0.0.1:$PORT${URLPATH:-/} >/dev/null
kill -RTMIN $PID
wrk -t1 -c8 -d4s "$@" http://127.0.0.1:$PORT${URLPATH:-/} | grep -E "requests in|Socket"
kill -RTMIN+1 $PID; sleep 1; kill -TERM $PID; wait $PID
