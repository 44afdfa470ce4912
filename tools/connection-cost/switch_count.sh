#!/bin/bash
# usage: switch_count.sh TREE new|keep  (STREAM=1 for the StreamServer)
TREE=$1; MODE=$2; cd $TREE; LOG=$(mktemp)
OUT=/tmp/sw.json /work/wt-speed/.venv/bin/python $(dirname $0)/switches.py -w 0 -b 127.0.0.1:0 benchmarks.hello_app:app > $LOG 2>&1 & PID=$!
for i in $(seq 100); do PORT=$(grep -oE '127.0.0.1:[0-9]+' $LOG | head -1 | cut -d: -f2); [ -n "$PORT" ] && break; sleep 0.1; done
CLIENT="
import http.client,sys
n=int(sys.argv[1])
if '$MODE'=='new':
    for i in range(n):
        c=http.client.HTTPConnection('127.0.0.1',$PORT); c.request('GET','/',headers={'Connection':'close'}); c.getresponse().read(); c.close()
else:
    c=http.client.HTTPConnection('127.0.0.1',$PORT)
    for i in range(n):
        c.request('GET','/'); c.getresponse().read()
"
/work/wt-speed/.venv/bin/python -c "$CLIENT" 50
kill -RTMIN $PID; sleep 0.2
/work/wt-speed/.venv/bin/python -c "$CLIENT" 1000
kill -RTMIN+1 $PID; sleep 0.5; kill $PID; wait $PID 2>/dev/null
/work/wt-speed/.venv/bin/python -c "
import json; c=json.load(open('/tmp/sw.json'))
print('switches per request:', sum(c.values())/1000)
for k,v in sorted(c.items(), key=lambda x:-x[1]): print(' ', round(v/1000,2), k)"
