#!/bin/bash
# usage: cpu_per_conn.sh forkserve|stream [TREE] [wrk extra]  -> server CPU ticks per request, wrk -H Connection: close
KIND=$1; TREE=${2:-/work/wt-speed}; DUR=${DUR:-5}
cd $TREE
LOG=$(mktemp)
if [ $KIND = stream ]; then /work/wt-speed/.venv/bin/python $(dirname $0)/stream_hello.py >$LOG 2>&1 &
else /work/wt-speed/.venv/bin/python -m forkserve -w 0 -b 127.0.0.1:0 benchmarks.hello_app:app >$LOG 2>&1 & fi
PID=$!
for i in $(seq 100); do PORT=$(grep -oE '127.0.0.1:[0-9]+' $LOG | head -1 | cut -d: -f2); [ -n "$PORT" ] && break; sleep 0.1; done
wrk -t1 -c8 -d1s ${NEW:+-H} ${NEW:+"Connection: close"} http://127.0.0.1:$PORT/ >/dev/null
read U0 S0 < <(sed "s/.*) //" /proc/$PID/stat | awk "{print \$12, \$13}")
OUT=$(wrk -t1 -c8 -d${DUR}s ${NEW:+-H} ${NEW:+"Connection: close"} http://127.0.0.1:$PORT/)
read U1 S1 < <(sed "s/.*) //" /proc/$PID/stat | awk "{print \$12, \$13}")
N=$(echo "$OUT" | grep -oE '^ *[0-9]+ requests' | grep -oE '[0-9]+')
kill $PID; wait $PID 2>/dev/null
echo "$KIND: $N requests, user $(python3 -c "print(round(($U1-$U0)*10000/$N,1))") us + sys $(python3 -c "print(round(($S1-$S0)*10000/$N,1))") us per request; $(echo "$OUT" | grep Requests/sec)"
