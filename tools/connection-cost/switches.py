import collections, json, os, runpy, signal, sys
import greenlet
counts = collections.Counter()
def name(g):
    run = getattr(g, "_run", None) or getattr(g, "run", None)
    return type(g).__name__ + ":" + getattr(run, "__qualname__", type(run).__name__)
def trace(event, args):
    if event in ("switch", "throw"):
        origin, target = args
        counts[name(origin) + " -> " + name(target)] += 1
def on(s, f):
    counts.clear(); greenlet.settrace(trace)
def off(s, f):
    greenlet.settrace(None); json.dump(counts, open(os.environ["OUT"], "w"))
signal.signal(signal.SIGRTMIN, on)
signal.signal(signal.SIGRTMIN + 1, off)
if os.environ.get("STREAM"):
    exec(open(os.path.join(os.path.dirname(__file__), "stream_hello.py")).read())
sys.argv[0] = "forkserve"
runpy.run_module("forkserve", run_name="__main__", alter_sys=True)
