#!/bin/bash
# Ad hoc: who takes the CPU from a preempted forkserve worker (sched_switch with
# prev_state R), forkserve -w 4 balanced [extra args], wrk -t1 -c64, 2 s of perf record.
set -e
WT=/work/wt/slice
cd $WT/benchmarks
PYTHONPATH=$WT:$WT/benchmarks setsid $WT/.venv/bin/python -P -m forkserve -w 4 -b 127.0.0.1:0 "$@" balance_app:app > /tmp/who-srv.log 2>&1 &
SRV=$!
for i in $(seq 100); do grep -q "Listening at" /tmp/who-srv.log && [ $(grep -c "Booting worker" /tmp/who-srv.log) -ge 4 ] && break; sleep 0.1; done
PORT=$(grep -o "127.0.0.1:[0-9]*" /tmp/who-srv.log | head -1 | cut -d: -f2)
wrk -t1 -c64 -d6s -s $WT/benchmarks/hello.lua http://127.0.0.1:$PORT/ > /tmp/who-wrk.txt &
W=$!
sleep 2
perf record -q -e sched:sched_switch -a -o /tmp/who.data -- sleep 2 2>/dev/null
wait $W
kill -9 -- -$SRV
perf script -i /tmp/who.data -F comm,pid,event,trace 2>/dev/null > /tmp/who.txt
grep -o "BENCH_RESULT.*" /tmp/who-wrk.txt | cut -c1-200
echo "switches from a preempted (R) python worker, by the task switched to:"
grep "prev_comm=python" /tmp/who.txt | grep "prev_state=R" | grep -o "next_comm=[^ ]*" | sort | uniq -c | sort -rn | head
echo "switches from a sleeping (S) python worker:"; grep "prev_comm=python" /tmp/who.txt | grep -v "prev_state=R" | wc -l
echo "wrk preempted by:"; grep "prev_comm=wrk" /tmp/who.txt | grep "prev_state=R" | grep -o "next_comm=[^ ]*" | sort | uniq -c | sort -rn | head -5
echo "wrk sleeping:"; grep "prev_comm=wrk" /tmp/who.txt | grep -v "prev_state=R" | wc -l
