"""Issue 33 item 4, the pure part: when accept() fails for want of
descriptors, one log line per interval with the counts, and the oldest
incomplete request heads are the ones shed (forkserve.http.shortage)."""

from forkserve.http.shortage import ShortageLog, oldest_heads


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_shortage_logs_its_first_failure_then_one_line_per_interval_with_counts():
    clock = Clock()
    log = ShortageLog(clock)
    lines = []
    for step in range(400):  # 40 s of a retry every 0.1 s
        lines.append(log.failed("Too many open files", 0))
        clock.now += 0.1
    said = [line for line in lines if line]
    assert len(said) == 4, said  # at 0, 10, 20 and 30 s
    assert said[0].startswith("cannot accept connections: Too many open files (1 failed accept")
    assert "100 failed accept(s) in the last 10 s" in said[1]
    assert "ulimit -n" in said[0]


def test_recovery_is_said_once_within_the_interval_rule_with_what_was_not_yet_said():
    clock = Clock()
    log = ShortageLog(clock)
    assert log.accepted() is None  # no shortage: nothing, ever
    assert log.failed("Too many open files", 3) is not None
    for _ in range(20):  # failures and successes alternate while shedding
        clock.now += 0.1
        assert log.failed("Too many open files", 2) is None
        assert log.accepted() is None
    clock.now += 10
    line = log.accepted()
    assert line.startswith("accepting connections again (20 failed accept(s) in the last 12 s, "
                           "40 incomplete request head(s) shed")
    assert log.accepted() is None
    clock.now += 1  # a new shortage within the interval waits for it
    assert log.failed("Too many open files", 0) is None
    clock.now += 10
    assert log.failed("Too many open files", 0).startswith(
        "cannot accept connections: Too many open files (2 failed accept(s) in the last 11 s")


def test_the_oldest_waiting_heads_are_shed_first():
    waiting = [(5.0, "c"), (1.0, "a"), (3.0, "b"), (9.0, "d")]
    assert oldest_heads(waiting, 2, now=20.0) == ["a", "b"]
    assert oldest_heads(waiting, 10, now=20.0) == ["a", "b", "c", "d"]
    assert oldest_heads(waiting, 0, now=20.0) == [] and oldest_heads([], 3, now=20.0) == []


def test_a_head_begun_a_moment_ago_is_never_shed():
    waiting = [(9.9, "just accepted"), (2.0, "slowloris")]
    assert oldest_heads(waiting, 2, now=10.0) == ["slowloris"]
    assert oldest_heads([(9.9, "just accepted")], 1, now=10.0) == []
    assert oldest_heads([(9.5, "half a second ago")], 1, now=10.0) == ["half a second ago"]
