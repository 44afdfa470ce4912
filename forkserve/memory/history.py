"""Memory over time: a bounded history of reports, for the stats dashboard.

Invariants, and why:

- Bounded whatever the uptime: the last `window` seconds are kept point by
  point; older points are folded into `step`-second buckets (the mean of
  each value over the bucket) kept for `coarse_window` seconds; at most
  `max_events` markers. The master keeps this in its own memory, so it must
  not grow with time.
- Pure: no clock, no /proc. The caller passes each Report in and asks
  `due(now)` when to read the next one; tests drive it with made-up reports.
- What a sample costs decides how often one is taken. A report makes the
  kernel walk every process's pages (about 13 ms per GiB mapped per process,
  benchmarks/results/report_time.md: 110-300 ms for 16 workers sharing
  1 GiB on 2 vCPUs), and the master's loop waits for it. The next sample is
  due `max(min_interval, cost / max_share)` seconds after one that took
  `cost`: every second for a small server, every few seconds for a big one,
  so sampling never takes more than `max_share` of the master's time.
  `cost` is the CPU time the sample took (the reader's own and the kernel's
  walks on its behalf), not the wall time: under load the master waits for
  a CPU, and charging that wait to the sample spaced a busy server's
  samples 14 s apart where they cost 20-40 ms of CPU (100,000 people, 4
  workers under wrk, on 2 shared CPUs).
- A client that asks for figures at most `max_age` seconds old (the Locust
  plugin, every 2 s) gets a fresh sample when the latest is older, at most
  `max_demand_share` of the master's time: sooner than the history's own
  pace, never without bound.
- A process is a series by what survives churn, as in Prometheus
  (render.series_labels): "master", "worker 1", "worker 2 g3" under a
  supervisor. A recycled worker's replacement continues its number's
  series (forkserve.process.lifecycle); a generation is one series whether
  starting, serving or draining. Each series point is
  (private, shared): private is the process's own anonymous memory (copies
  and allocations, model's "private") and shared the rest of its PSS (its
  share of pages other processes map too), so stacking every process gives
  the server's total PSS, what the machine pays.
- The page says in one sentence what the newest sample costs: the same
  headline `forkserve memory` prints (render.headline), made here from the
  sample's report so that the page and the command never disagree.
- A recycle (a series whose pid changed) and a new generation are markers.
  The request rate is counted per pid, so a recycle (a counter starting
  again at 0) never reads as a negative rate.
- The history outlives the master's exec into the supervisor at the first
  reload: `dump()` gives everything kept as JSON-ready data and `load()`
  rebuilds it (forkserve.process.generation_protocol hands it over in a
  memfd). Only the rate's baseline is not handed over: the first sample
  after the exec has no rate.
"""

import collections
import math

from forkserve.memory import render

__all__ = ["History", "Point"]

#: Version of History.to_json(); bumped if a change would break the page.
JSON_SCHEMA = 1


class Point:
    """One sample: when, the request rate since the sample before, and each
    series' (private, shared) bytes."""

    __slots__ = ("time", "rate", "values")

    def __init__(self, time, rate, values):
        self.time = time
        self.rate = rate  # requests per second, or None when unknown
        self.values = values  # {series label: (private, shared)}

    def to_json(self):
        return {"t": round(self.time, 3), "rate": _rounded(self.rate),
                "values": {label: [round(private), round(shared)]
                           for label, (private, shared) in self.values.items()}}


def _rounded(value):
    return None if value is None else round(value, 3)


class _Bucket:
    """Fine points folded into one coarse point: sums and counts, then means."""

    __slots__ = ("index", "times", "rates", "sums")

    def __init__(self, index):
        self.index = index
        self.times = []
        self.rates = []
        self.sums = {}  # label: [private sum, shared sum, count]

    def add(self, point):
        self.times.append(point.time)
        if point.rate is not None:
            self.rates.append(point.rate)
        for label, (private, shared) in point.values.items():
            total = self.sums.setdefault(label, [0, 0, 0])
            total[0] += private
            total[1] += shared
            total[2] += 1

    def point(self):
        rate = sum(self.rates) / len(self.rates) if self.rates else None
        values = {label: (private / count, shared / count)
                  for label, (private, shared, count) in self.sums.items()}
        return Point(sum(self.times) / len(self.times), rate, values)


def _label(key, supervised):
    """A series' name from its Prometheus key (render.series_labels): "master",
    "worker 2", "worker 2 g3" under a supervisor, "worker 2 draining" for a
    recycled worker still draining beside its replacement. A generation's
    state is left out, so that starting, serving and draining are one series."""
    text = f"worker {key['worker']}" if "worker" in key else key["role"]
    if supervised and "generation" in key:
        text = f"{text} g{key['generation']}"
    if "state" in key:
        text = f"{text} {key['state']}"
    if "pid" in key:
        text = f"{text} (pid {key['pid']})"
    return text


def _point_from_json(data):
    return Point(data["t"], data["rate"],
                 {label: tuple(pair) for label, pair in data["values"].items()})


class History:
    #: seconds kept sample by sample
    window = 3600.0
    #: seconds per downsampled point beyond the window
    step = 60.0
    #: seconds of downsampled points kept (beyond the window)
    coarse_window = 23 * 3600.0
    #: markers kept (recycles, generations)
    max_events = 500
    #: the shortest time between samples, seconds
    min_interval = 1.0
    #: the largest part of the sampler's time a sample may take (see above)
    max_share = 0.02
    #: the same for samples a client asks for (`due(now, max_age)`)
    max_demand_share = 0.1

    def __init__(self, **tunables):
        for name, value in tunables.items():
            if not hasattr(type(self), name):
                raise TypeError(f"History has no tunable {name!r}")
            setattr(self, name, value)
        self.fine = collections.deque()
        self.coarse = collections.deque()
        self.bucket = None
        self.events = collections.deque(maxlen=self.max_events)
        self.series = {}  # label: {"role", "worker", "generation"}, of the kept points
        self.interval = self.min_interval
        self.next_due = -math.inf
        self.sampled_at = -math.inf  # monotonic time the latest sample was started
        self.cost = 0.0  # CPU seconds the latest sample took
        self.last = None  # (time, {label: (pid, generation)} of workers, {pid: requests})
        #: the newest report added: the stats endpoint serves it as the
        #: current one until the next sample is due
        self.latest = None
        self.generation = None  # the newest generation seen
        self.headline = None  # render.headline() of the newest sample

    # -- when to sample --

    def due(self, now, max_age=None):
        """Whether a sample is due at monotonic time now: at the history's
        pace, or sooner for a client that wants figures at most `max_age`
        seconds old."""
        if now >= self.next_due:
            return True
        if max_age is None:
            return False
        age = now - self.sampled_at
        return age > max_age and age >= max(self.min_interval,
                                            self.cost / self.max_demand_share)

    def sampled(self, started, cost):
        """Record that a sample started at monotonic `started` and took
        `cost` seconds of CPU."""
        self.cost = max(0.0, cost)
        self.sampled_at = started
        self.interval = max(self.min_interval, self.cost / self.max_share)
        self.next_due = started + self.interval

    # -- what was sampled --

    def add(self, report):
        """Add a memory report (forkserve.memory.model.Report) as a point."""
        now = report.time
        values, pids, requests = {}, {}, {}
        supervised = any(row.info.role == "supervisor" for row in report.processes)
        keys = render.series_labels([row.info for row in report.processes])
        for row, key in zip(report.processes, keys):
            info, memory = row.info, row.memory
            label = _label(dict(key), supervised)
            private = memory.private
            values[label] = (private, max(0, memory.pss - private))
            if info.role == "worker":
                pids[label] = (info.pid, info.generation)
            if info.requests is not None:
                requests[info.pid] = info.requests
            self.series.setdefault(label, {"role": info.role, "worker": info.worker_id,
                                           "generation": info.generation})
            self._note_generation(now, info)
        self._note_recycles(now, pids)
        point = Point(now, self._rate(now, requests), values)
        self.last = (now, pids, requests)
        self.headline = render.headline(report)
        self.latest = report
        self.fine.append(point)
        self._expire(now)

    def _note_generation(self, now, info):
        if info.role not in ("master", "single") or info.generation is None:
            return
        if self.generation is not None and info.generation > self.generation:
            self.events.append({"t": now, "kind": "generation",
                                "text": f"generation {info.generation} started"})
        if self.generation is None or info.generation > self.generation:
            self.generation = info.generation  # the first is where the history starts

    def _note_recycles(self, now, pids):
        if self.last is None:
            return
        before = self.last[1]
        for label, (pid, generation) in pids.items():
            old, old_generation = before.get(label, (pid, generation))
            if old != pid and old_generation == generation:  # not a new generation's worker
                self.events.append({"t": now, "kind": "recycle",
                                    "text": f"{label}: pid {old} replaced by {pid}"})

    def _rate(self, now, requests):
        if self.last is None or not requests:
            return None
        then, _, before = self.last
        if now <= then:
            return None
        served = sum(count - before.get(pid, 0) if count >= before.get(pid, 0) else count
                     for pid, count in requests.items())
        return served / (now - then)

    def _expire(self, now):
        expired = False  # a bucket closed or a coarse point dropped: once a step at most
        while self.fine and self.fine[0].time < now - self.window:
            point = self.fine.popleft()
            index = math.floor(point.time / self.step)
            if self.bucket is not None and self.bucket.index != index:
                self.coarse.append(self.bucket.point())
                self.bucket = None
                expired = True
            if self.bucket is None:
                self.bucket = _Bucket(index)
            self.bucket.add(point)
        horizon = now - self.window - self.coarse_window
        while self.coarse and self.coarse[0].time < horizon:
            self.coarse.popleft()
            expired = True
        if expired:  # forget series no kept point has
            kept = {label for point in self.points() for label in point.values}
            self.series = {label: about for label, about in self.series.items()
                           if label in kept}

    # -- across the exec into the supervisor --

    def dump(self):
        """Everything kept, as JSON-ready data for `load()`."""
        bucket = None
        if self.bucket is not None:
            bucket = {"index": self.bucket.index, "times": self.bucket.times,
                      "rates": self.bucket.rates, "sums": self.bucket.sums}
        return {"schema": JSON_SCHEMA, "fine": [point.to_json() for point in self.fine],
                "coarse": [point.to_json() for point in self.coarse], "bucket": bucket,
                "events": list(self.events), "series": self.series,
                "interval": self.interval, "generation": self.generation,
                "headline": self.headline}

    @classmethod
    def load(cls, data, **tunables):
        """A History holding what `dump()` gave (ValueError if it is not that)."""
        if not isinstance(data, dict) or data.get("schema") != JSON_SCHEMA:
            raise ValueError("not a forkserve memory history of this version")
        history = cls(**tunables)
        try:
            history.fine.extend(_point_from_json(point) for point in data["fine"])
            history.coarse.extend(_point_from_json(point) for point in data["coarse"])
            if data["bucket"] is not None:
                history.bucket = _Bucket(data["bucket"]["index"])
                history.bucket.times = list(data["bucket"]["times"])
                history.bucket.rates = list(data["bucket"]["rates"])
                history.bucket.sums = {label: list(sums)
                                       for label, sums in data["bucket"]["sums"].items()}
            history.events.extend(data["events"])
            history.series = dict(data["series"])
            history.interval = float(data["interval"])
            history.generation = data["generation"]
            history.headline = data.get("headline")  # absent from older masters' dumps
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a forkserve memory history: {exc!r}") from None
        return history

    # -- what the page reads --

    def points(self):
        """Every point, oldest first: downsampled ones, then the window's."""
        pending = [self.bucket.point()] if self.bucket is not None else []
        return [*self.coarse, *pending, *self.fine]

    def to_json(self, since=None):
        """The history as JSON-ready data; only points after `since` (epoch
        seconds) if given, for a page that already has the rest::

            {"schema": 1, "interval": seconds between samples now,
             "window": seconds kept point by point, "step": seconds per
             point beyond it,
             "series": {label: {"role", "worker", "generation"}},
             "points": [{"t": epoch seconds, "rate": requests/s or null,
                         "values": {label: [private bytes, shared bytes]}}],
             "events": [{"t", "kind": "recycle" | "generation", "text"}],
             "headline": what the newest sample costs, in one sentence, or null}
        """
        points = self.points()
        events = list(self.events)
        if since is not None:
            points = [point for point in points if point.time > since]
            events = [event for event in events if event["t"] > since]
        return {"schema": JSON_SCHEMA, "interval": self.interval, "window": self.window,
                "step": self.step, "series": self.series,
                "points": [point.to_json() for point in points], "events": events,
                "headline": self.headline}
