#!/bin/bash
# usage: strace_count.sh TREE MODE(new|keep) N
TREE=$1; MODE=$2; N=${3:-1000}
cd $TREE
LOG=$(mktemp)
/work/wt-speed/.venv/bin/python -m forkserve -w 0 -b 127.0.0.1:0 benchmarks.hello_app:app >$LOG 2>&1 &
PID=$!
for i in $(seq 100); do PORT=$(grep -oE '127.0.0.1:[0-9]+' $LOG | head -1 | cut -d: -f2); [ -n "$PORT" ] && break; sleep 0.1; done
/work/wt-speed/.venv/bin/python - $PORT $MODE 50 <<'PY'
import sys, http.client
port, mode, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(n):
    c = http.client.HTTPConnection("127.0.0.1", port); c.request("GET", "/", headers={"Connection": "close"}); c.getresponse().read(); c.close()
PY
strace ${STRACE_ARGS:--c} -f -p $PID -o /tmp/speed-strace.out &
SP=$!
sleep 1
/work/wt-speed/.venv/bin/python - $PORT $MODE $N <<'PY'
import sys, http.client
port, mode, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if mode == "new":
    for i in range(n):
        c = http.client.HTTPConnection("127.0.0.1", port); c.request("GET", "/", headers={"Connection": "close"}); r = c.getresponse(); r.read(); assert r.status == 200; c.close()
else:
    c = http.client.HTTPConnection("127.0.0.1", port)
    for i in range(n):
        c.request("GET", "/"); r = c.getresponse(); r.read(); assert r.status == 200
PY
sleep 0.5
kill -INT $SP; wait $SP
kill $PID; wait $PID 2>/dev/null
cat /tmp/speed-strace.out
