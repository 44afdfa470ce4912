"""forkserve.memory: parsing /proc text, the derived report, its renderings,
and the `forkserve memory` command.

Parsing is tested on text captured from /proc (tests/data/proc, see its
README); the live tests fork real processes and compare our readings with an
independent reading of /proc/PID/smaps_rollup.
"""

import collections
import contextlib
import dataclasses
import errno
import gc
import http.server
import json
import logging
import os
import re
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import hypothesis
import hypothesis.strategies as st
import pytest

from forkserve.memory import command, copied_objects, cow, model, procfs, render, report_json, workergc
from forkserve.memory.model import ProcessInfo, ProcessRow, Report
from forkserve.memory.procfs import ProcessMemory

DATA = Path(__file__).parent / "data" / "proc"
KIB = 1024
MIB = 1024 * 1024

# tests/data/proc/5389: /bin/sleep run as "my (odd) proc)" on Linux 6.18.
SLEEP_PID = 5389
# tests/data/proc/4049: crafted Linux 4.9 process, smaps but no smaps_rollup.
OLD_KERNEL_PID = 4049
BOOT_TIME = 1795321463  # btime in tests/data/proc/stat

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def fixture_text(*parts):
    return DATA.joinpath(*map(str, parts)).read_text()


def make_memory(pid=1, *, rss, pss, shared_clean=0, shared_dirty=0, private_clean=0,
                private_dirty=0, swap=0, anonymous=None, pss_anon=0, pss_file=0,
                minor_faults=0, major_faults=0, start_time=1000.0):
    return ProcessMemory(
        pid=pid, rss=rss, pss=pss, shared_clean=shared_clean, shared_dirty=shared_dirty,
        private_clean=private_clean, private_dirty=private_dirty, swap=swap,
        anonymous=rss if anonymous is None else anonymous, pss_anon=pss_anon,
        pss_file=pss_file,
        minor_faults=minor_faults, major_faults=major_faults, start_time=start_time,
    )


def make_report():
    """A master of 100 MiB whose two workers share most of it."""
    master = make_memory(
        100, rss=100 * MIB, pss=40 * MIB, shared_clean=90 * MIB, private_dirty=10 * MIB,
        anonymous=80 * MIB, minor_faults=5000, major_faults=3, start_time=1000.0,
    )
    worker1 = make_memory(
        101, rss=95 * MIB, pss=35 * MIB, shared_clean=90 * MIB, private_dirty=5 * MIB,
        anonymous=75 * MIB, swap=4 * KIB, minor_faults=700, start_time=1010.0,
    )
    worker2 = make_memory(
        102, rss=95 * MIB, pss=35 * MIB, shared_clean=89 * MIB, shared_dirty=1 * MIB,
        private_clean=1 * MIB, private_dirty=4 * MIB, anonymous=75 * MIB, minor_faults=650, start_time=1010.5,
    )
    rows = (
        ProcessRow(ProcessInfo(100, "master"), master, 3723.0),
        ProcessRow(ProcessInfo(101, "worker", 1, requests=1200, generation=1), worker1, 3713.0),
        ProcessRow(ProcessInfo(102, "worker", 2, requests=None, generation=1), worker2, 3712.5),
    )
    return Report(rows, time=4723.0)


# -- Parsing ------------------------------------------------------------------


def test_smaps_rollup_fields_are_converted_from_kb_to_bytes():
    fields = procfs.parse_smaps_rollup(fixture_text(SLEEP_PID, "smaps_rollup"))
    assert fields["Rss"] == 1828 * KIB
    assert fields["Pss"] == 349 * KIB
    assert fields["Shared_Clean"] == 1676 * KIB
    assert fields["Shared_Dirty"] == 0
    assert fields["Private_Clean"] == 40 * KIB
    assert fields["Private_Dirty"] == 112 * KIB
    assert fields["Swap"] == 0
    assert fields["Pss_Anon"] == 112 * KIB  # every kB field is kept, not only the seven


def test_smaps_rollup_header_line_is_not_a_field():
    fields = procfs.parse_smaps_rollup(fixture_text(SLEEP_PID, "smaps_rollup"))
    assert all(re.fullmatch(r"[A-Za-z_]+", name) for name in fields)


def test_smaps_rollup_missing_fields_are_absent_and_read_as_zero():
    text = textwrap.dedent("""\
        00400000-7fff00000000 ---p 00000000 00:00 0    [rollup]
        Rss:                   8 kB
        Pss:                   6 kB
        Private_Dirty:         4 kB
        """)
    fields = procfs.parse_smaps_rollup(text)
    assert fields == {"Rss": 8 * KIB, "Pss": 6 * KIB, "Private_Dirty": 4 * KIB}
    stat = procfs.parse_stat(fixture_text(SLEEP_PID, "stat"))
    mem = ProcessMemory.from_proc(stat, fields, boot_time=BOOT_TIME, clock_ticks=100)
    assert (mem.swap, mem.shared_clean, mem.private_clean) == (0, 0, 0)
    assert mem.uss == 4 * KIB


def test_smaps_without_rollup_is_summed_over_mappings():
    fields = procfs.parse_smaps(fixture_text(OLD_KERNEL_PID, "smaps"))
    assert fields["Rss"] == 22740 * KIB
    assert fields["Pss"] == 20084 * KIB
    assert fields["Shared_Clean"] == 2944 * KIB
    assert fields["Shared_Dirty"] == 1264 * KIB
    assert fields["Private_Clean"] == 0
    assert fields["Private_Dirty"] == 18532 * KIB
    assert fields["Swap"] == 1036 * KIB


def test_smaps_per_mapping_attributes_are_not_summed():
    fields = procfs.parse_smaps(fixture_text(OLD_KERNEL_PID, "smaps"))
    assert not {"Size", "KernelPageSize", "MMUPageSize", "VmFlags", "THPeligible"} & set(fields)


def test_smaps_mapping_path_that_looks_like_a_field_is_not_counted():
    text = textwrap.dedent("""\
        7f0000000000-7f0000001000 rw-s 00000000 00:05 42    /tmp/Rss: 5000 kB
        Rss:                   4 kB
        Private_Dirty:         4 kB
        VmFlags: rd wr sh
        """)
    assert procfs.parse_smaps(text) == {"Rss": 4 * KIB, "Private_Dirty": 4 * KIB}


def test_smaps_sum_agrees_with_rollup_of_the_same_process():
    rollup = procfs.parse_smaps_rollup(fixture_text(SLEEP_PID, "smaps_rollup"))
    summed = procfs.parse_smaps(fixture_text(SLEEP_PID, "smaps"))
    assert summed["Rss"] == rollup["Rss"]
    # smaps rounds each mapping's Pss down, and a page changed hands between reads.
    assert summed["Pss"] == pytest.approx(rollup["Pss"], rel=0.05)
    # Pss_Anon and Pss_File are rollup-only: smaps prints no per-mapping split.
    assert set(name for name, _ in procfs.MEMORY_FIELDS) - {"Pss_Anon", "Pss_File"} <= set(summed)


def test_parsers_accept_bytes_as_well_as_text():
    text = fixture_text(SLEEP_PID, "smaps_rollup")
    assert procfs.parse_smaps_rollup(text.encode()) == procfs.parse_smaps_rollup(text)
    stat = fixture_text(SLEEP_PID, "stat")
    assert procfs.parse_stat(stat.encode()) == procfs.parse_stat(stat)


def test_stat_comm_with_spaces_and_parens_is_read_whole():
    stat = procfs.parse_stat(fixture_text(SLEEP_PID, "stat"))
    assert stat == procfs.ProcStat(
        pid=SLEEP_PID, comm="my (odd) proc)", state="S", ppid=5385,
        minflt=104, majflt=0, starttime_ticks=67347,
    )


def test_stat_fault_counts_and_start_ticks_come_from_their_fields():
    stat = procfs.parse_stat(fixture_text(OLD_KERNEL_PID, "stat"))
    assert (stat.pid, stat.comm, stat.ppid) == (OLD_KERNEL_PID, "python3", 1)
    assert (stat.minflt, stat.majflt, stat.starttime_ticks) == (51234, 12, 123456)


def test_stat_comm_with_newline_and_closing_paren_is_read_whole():
    rest = " ".join(["S", "7"] + [str(n) for n in range(5, 53)])
    stat = procfs.parse_stat(f"42 (a)\n) b) {rest}\n")
    assert (stat.pid, stat.comm, stat.state, stat.ppid) == (42, "a)\n) b", "S", 7)
    assert (stat.minflt, stat.majflt, stat.starttime_ticks) == (10, 12, 22)


@hypothesis.given(
    comm=st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=64)
)
def test_stat_any_comm_round_trips(comm):
    line = f"123 ({comm}) R 1 " + " ".join(str(n) for n in range(5, 53)) + "\n"
    stat = procfs.parse_stat(line)
    assert (stat.pid, stat.comm, stat.ppid, stat.starttime_ticks) == (123, comm, 1, 22)


@pytest.mark.parametrize("text", ["", "garbage", "12 (x) S 1 2 3\n", "(x) S " + "1 " * 50])
def test_stat_rejects_text_that_is_not_a_stat_line(text):
    with pytest.raises(ValueError):
        procfs.parse_stat(text)


def test_boot_time_is_btime_from_proc_stat():
    assert procfs.parse_boot_time(fixture_text("stat")) == BOOT_TIME
    with pytest.raises(ValueError, match="btime"):
        procfs.parse_boot_time("cpu 1 2 3\n")


def test_children_file_is_space_separated_pids():
    assert procfs.parse_children("101 102 \n") == [101, 102]
    assert procfs.parse_children("") == []


# -- Reading a /proc tree -------------------------------------------------------


def test_read_process_uses_smaps_rollup_and_stat():
    mem = procfs.read_process(SLEEP_PID, proc=DATA)
    assert mem == ProcessMemory(
        pid=SLEEP_PID, rss=1828 * KIB, pss=349 * KIB, shared_clean=1676 * KIB, shared_dirty=0,
        private_clean=40 * KIB, private_dirty=112 * KIB, swap=0, anonymous=112 * KIB,
        pss_anon=112 * KIB, pss_file=237 * KIB, minor_faults=104, major_faults=0,
        start_time=BOOT_TIME + 67347 / os.sysconf("SC_CLK_TCK"),
    )


def test_read_process_falls_back_to_smaps_on_kernels_without_rollup():
    assert not (DATA / str(OLD_KERNEL_PID) / "smaps_rollup").exists()
    mem = procfs.read_process(OLD_KERNEL_PID, proc=DATA)
    assert (mem.rss, mem.pss, mem.swap) == (22740 * KIB, 20084 * KIB, 1036 * KIB)
    assert mem.uss == 18532 * KIB
    assert (mem.minor_faults, mem.major_faults) == (51234, 12)


def test_read_process_of_missing_pid_is_none():
    assert procfs.read_process(999999999, proc=DATA) is None


def test_read_process_lets_permission_errors_through(monkeypatch):
    real_read = procfs._read

    def read(path):
        if path.endswith("smaps_rollup"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_read(path)

    monkeypatch.setattr(procfs, "_read", read)
    with pytest.raises(PermissionError):
        procfs.read_process(SLEEP_PID, proc=DATA)


def write_stat(proc, pid, ppid, state="S"):
    template = fixture_text(OLD_KERNEL_PID, "stat")
    line = template.replace("4049 (python3) S 1 ", f"{pid} (python3) {state} {ppid} ", 1)
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(line)


def test_discover_reads_children_files_of_every_thread(tmp_path):
    write_stat(tmp_path, 100, 1)
    (tmp_path / "100/task/100").mkdir(parents=True)
    (tmp_path / "100/task/100/children").write_text("102 101 ")
    (tmp_path / "100/task/105").mkdir(parents=True)
    (tmp_path / "100/task/105/children").write_text("103 ")
    infos = model.discover(100, proc=tmp_path)
    assert infos == [
        ProcessInfo(100, "master"),
        ProcessInfo(101, "worker"),
        ProcessInfo(102, "worker"),
        ProcessInfo(103, "worker"),
    ]


def test_discover_scans_proc_when_kernel_has_no_children_files(tmp_path):
    write_stat(tmp_path, 100, 1)
    (tmp_path / "100/task/100").mkdir(parents=True)
    write_stat(tmp_path, 101, 100)
    write_stat(tmp_path, 102, 1)
    write_stat(tmp_path, 103, 100)
    (tmp_path / "self").mkdir()
    infos = model.discover(100, proc=tmp_path)
    assert [(i.pid, i.role, i.worker_id) for i in infos] == [
        (100, "master", None), (101, "worker", None), (103, "worker", None)
    ]


def test_discover_without_children_is_a_single_process(tmp_path):
    write_stat(tmp_path, 100, 1)
    (tmp_path / "100/task/100").mkdir(parents=True)
    (tmp_path / "100/task/100/children").write_text("")
    assert model.discover(100, proc=tmp_path) == [ProcessInfo(100, "single")]


def test_discover_of_exited_master_raises_process_lookup_error(tmp_path):
    with pytest.raises(ProcessLookupError):
        model.discover(100, proc=tmp_path)
    write_stat(tmp_path, 100, 1, state="Z")
    with pytest.raises(ProcessLookupError):
        model.discover(100, proc=tmp_path)


def test_collect_drops_vanished_and_repeated_processes_and_derives_uptime():
    infos = [
        ProcessInfo(SLEEP_PID, "master"),
        ProcessInfo(999999999, "worker", worker_id=1),
        ProcessInfo(OLD_KERNEL_PID, "worker", worker_id=2, requests=7),
        ProcessInfo(OLD_KERNEL_PID, "worker", worker_id=3),
    ]
    start = BOOT_TIME + 67347 / os.sysconf("SC_CLK_TCK")
    report = model.collect(infos, now=start + 90.0, proc=DATA)
    assert [row.info.pid for row in report.processes] == [SLEEP_PID, OLD_KERNEL_PID]
    assert report.processes[0].uptime == pytest.approx(90.0)
    assert report.processes[1].info.requests == 7
    assert report.time == start + 90.0


def test_read_processes_keeps_the_order_and_reads_on_several_threads():
    # Reads are taken from the end; the last three wait for each other, so
    # they only return if three threads read at once.
    together = threading.Barrier(3, timeout=10)

    def read(pid, proc):
        if pid >= 9:
            together.wait()
        return pid * 10

    assert model.read_processes(range(12), read=read, threads=3) == [n * 10 for n in range(12)]


def test_read_processes_passes_an_error_on():
    def read(pid, proc):
        if pid == 5:
            raise PermissionError(13, "Permission denied", f"/proc/{pid}/smaps_rollup")
        return pid

    with pytest.raises(PermissionError):
        model.read_processes(range(8), read=read, threads=2)


# -- The report -------------------------------------------------------------------


def test_uss_shared_and_shared_fraction_of_a_process():
    mem = make_memory(rss=100, pss=50, shared_clean=60, shared_dirty=15, private_clean=5,
                      private_dirty=20)
    assert mem.uss == 25
    assert mem.shared == 75
    assert mem.shared_fraction == 0.75


def test_shared_fraction_of_a_process_with_nothing_resident_is_zero():
    assert make_memory(rss=0, pss=0).shared_fraction == 0.0


def test_cost_ratio_and_workers_cost_are_relative_to_master_rss():
    report = make_report()
    assert report.total_pss == 110 * MIB
    assert report.master_rss == 100 * MIB
    assert report.workers_cost == 10 * MIB
    assert report.cost_ratio == pytest.approx(1.1)
    assert report.total_uss == 10 * MIB + 5 * MIB + 5 * MIB
    assert report.requests == 1200
    assert (report.minor_faults, report.major_faults) == (6350, 3)


def test_cost_ratio_counts_anonymous_memory_where_the_kernel_splits_pss():
    # A store server: the master maps the store; worker 2 alone read 296 MiB
    # of it (file pages) and copied 1 MiB.
    master = make_memory(100, rss=40 * MIB, pss=20 * MIB, anonymous=30 * MIB,
                         pss_anon=12 * MIB, pss_file=8 * MIB)
    worker = make_memory(101, rss=330 * MIB, pss=310 * MIB, anonymous=31 * MIB,
                         private_dirty=1 * MIB, private_clean=296 * MIB, pss_anon=13 * MIB,
                         pss_file=297 * MIB)
    report = Report((ProcessRow(ProcessInfo(100, "master"), master, 1.0),
                     ProcessRow(ProcessInfo(101, "worker", 2), worker, 1.0)), 0.0)
    assert report.ratio_basis == "anonymous"
    assert (report.master_base, report.total_base) == (30 * MIB, 25 * MIB)
    assert report.cost_ratio == pytest.approx(25 / 30)
    assert report.workers_cost == -5 * MIB
    assert render.format_table(report).splitlines()[-2:] == [
        "2 processes use 330.0 MiB: 330.0 MiB for one copy of the application, 0 B more for "
        "its worker",
        "workers add -5.0 MiB to the master's 30.0 MiB of anonymous memory; serving workers "
        "hold 1.0 MiB alone (their own allocations and any pages copied from the master); "
        "file pages 305.0 MiB (page cache: shared, reclaimable)"]


def _server(master, workers):
    rows = [ProcessRow(ProcessInfo(100, "master"), master, 1.0)]
    rows += [ProcessRow(ProcessInfo(101 + n, "worker", n + 1), workers, 1.0) for n in range(4)]
    return Report(tuple(rows), 0.0)


# PersonDB, 300,000 people, forkserve -w 4 --no-share-heap on Python 3.12.1, after
# 100,000 random lookups with wrk: `forkserve memory --json` of each mode
# (tests/data/persondb_memory/README.md says how they were taken). The old
# headline read them "3.8x less" (store), "4.9x less" (share), "1.8x less" (dict).
PERSONDB = Path(__file__).parent / "data" / "persondb_memory"
#: the modes by what the machine paid for them (the sum of PSS), cheapest first
PERSONDB_BY_COST = ("store", "share", "dict")
SIZE = re.compile(r"(-?[\d.]+) (B|KiB|MiB|GiB|TiB)")
FACTOR = re.compile(r"([\d.]+)x (less|more)")


def persondb_report(mode):
    return report_json.from_json(json.loads((PERSONDB / f"{mode}.json").read_text()))


def _size(text):
    number, unit = SIZE.fullmatch(text).groups()
    return float(number) * 1024 ** ("B", "KiB", "MiB", "GiB", "TiB").index(unit)


def ranked_by_a_reader(headlines):
    """The runs in the order each figure of the whole server on their first
    lines puts them, cheapest first: the first size (what they use), and
    every factor, read as the line says it (more "x less" is cheaper)."""
    orders = [sorted(headlines, key=lambda mode: _size(SIZE.search(headlines[mode])[0]))]
    if all(FACTOR.search(line) for line in headlines.values()):
        def cheaper_first(mode):
            number, direction = FACTOR.search(headlines[mode]).groups()
            return -float(number) if direction == "less" else float(number)
        orders.append(sorted(headlines, key=cheaper_first))
    return orders


def test_headlines_of_a_store_a_share_and_a_dict_run_rank_them_by_what_they_cost():
    headlines = {mode: render.headline(persondb_report(mode)) for mode in PERSONDB_BY_COST}
    for order in ranked_by_a_reader(headlines):
        assert order == list(PERSONDB_BY_COST)
    assert headlines == {
        "store": "5 processes use 301.1 MiB: 278.8 MiB for one copy of the application, "
                 "5.6 MiB more for each of 4 workers",
        "share": "5 processes use 946.8 MiB: 924.4 MiB for one copy of the application, "
                 "5.6 MiB more for each of 4 workers",
        "dict": "5 processes use 2.5 GiB: 924.3 MiB for one copy of the application, "
                "417.0 MiB more for each of 4 workers",
    }
    for mode, line in headlines.items():  # the first figure is the sum of PSS, and its parts
        report = persondb_report(mode)  # add up to it, to the digits shown
        first, once, each = SIZE.finditer(line)
        assert first[0] == render.format_size(report.total_pss)
        shown = 0.05 * (_size(f"1 {once[2]}") + 4 * _size(f"1 {each[2]}"))
        assert abs(_size(once[0]) + 4 * _size(each[0]) - report.total_pss) <= shown


def test_headline_of_workers_that_copied_everything_says_each_costs_a_whole_process():
    master = make_memory(rss=800 * MIB, pss=800 * MIB, anonymous=800 * MIB, pss_anon=800 * MIB,
                         private_dirty=800 * MIB)
    assert render.headline(_server(master, master)) == (
        "5 processes use 3.9 GiB: 800.0 MiB for one copy of the application, "
        "800.0 MiB more for each of 4 workers")


def test_headline_counts_a_mapped_files_pages_once_however_many_workers_read_them():
    # store mode: a 20 MiB heap; the workers read the same 200 MiB of a mapped
    # file, in the page cache once (each worker's PSS holds a quarter of it).
    master = make_memory(rss=20 * MIB, pss=4 * MIB, anonymous=20 * MIB, pss_anon=4 * MIB)
    reader = make_memory(rss=226 * MIB, pss=56 * MIB, anonymous=26 * MIB, pss_anon=6 * MIB,
                         pss_file=50 * MIB, private_dirty=2 * MIB)
    assert render.headline(_server(master, reader)) == (
        "5 processes use 228.0 MiB: 220.0 MiB for one copy of the application, "
        "2.0 MiB more for each of 4 workers")


def test_headline_names_what_else_runs_beside_the_serving_workers():
    # After a reload: a supervisor (12 MiB of its own), generation 2 serving
    # (a master of 30 MiB shared with its worker, which allocated 2 MiB more)
    # and generation 1 draining, alike; 5 MiB of file pages each.
    def memory(anonymous, pss_anon):
        return make_memory(rss=anonymous + 20 * MIB, pss=pss_anon + 5 * MIB, anonymous=anonymous,
                           pss_anon=pss_anon, pss_file=5 * MIB)
    master, worker = memory(30 * MIB, 15 * MIB), memory(32 * MIB, 17 * MIB)
    rows = [(ProcessInfo(1, "supervisor"), memory(12 * MIB, 12 * MIB)),
            (ProcessInfo(20, "master", generation=2, state="serving"), master),
            (ProcessInfo(21, "worker", 1, generation=2, state="serving"), worker),
            (ProcessInfo(10, "master", generation=1, state="draining"), master),
            (ProcessInfo(11, "worker", 1, generation=1, state="draining"), worker)]
    report = Report(tuple(ProcessRow(info, mem, 1.0) for info, mem in rows), 0.0)
    assert render.headline(report) == (
        "5 processes use 101.0 MiB: 55.0 MiB for one copy of the application, 2.0 MiB more for "
        "its worker; the 3 other processes (a supervisor, a draining master, a draining worker) "
        "add 44.0 MiB")
    settled = Report(report.processes[:3], 0.0)  # the old generation gone
    assert render.headline(settled) == (
        "3 processes use 59.0 MiB: 45.0 MiB for one copy of the application, 2.0 MiB more for "
        "its worker; the supervisor adds 12.0 MiB")


def test_headline_of_a_master_whose_workers_are_gone_and_of_workers_without_a_master():
    row = make_report().processes[0]
    assert render.headline(Report((row,), 0.0)) == (
        "1 process uses 40.0 MiB (the master alone: no worker is running)")
    workers = Report(make_report().processes[1:], 0.0)
    assert render.headline(workers) == (
        "2 processes use 70.0 MiB (no serving master to tell what each adds)")


def test_workers_are_not_said_to_hold_copies_of_what_they_allocated_themselves():
    text = render.format_table(make_report())
    assert "copies" not in text
    assert "hold 9.0 MiB alone (their own allocations and any pages copied" in text


def test_report_without_a_master_has_no_cost_ratio():
    report = make_report()
    workers_only = Report(report.processes[1:], report.time)
    assert workers_only.master is None
    assert workers_only.master_rss is None
    assert workers_only.workers_cost is None
    assert workers_only.cost_ratio is None
    assert workers_only.total_pss == 70 * MIB


def test_requests_are_unknown_when_no_process_knows_them():
    rows = tuple(
        ProcessRow(ProcessInfo(row.info.pid, row.info.role), row.memory, row.uptime)
        for row in make_report().processes
    )
    assert Report(rows, 0.0).requests is None


def test_process_info_rejects_an_unknown_role():
    with pytest.raises(ValueError, match="master, worker, single"):
        ProcessInfo(1, "manager")


def test_private_is_anonymous_private_memory_and_file_pages_are_apart():
    # A worker that touched 296 MiB of a mapped store file alone (Private_Clean)
    # and copied 6 MiB of the master's heap (Private_Dirty, anonymous).
    worker = make_memory(rss=400 * MIB, pss=330 * MIB, shared_clean=90 * MIB,
                         private_clean=296 * MIB, private_dirty=6 * MIB, anonymous=80 * MIB)
    assert worker.uss == 302 * MIB
    assert worker.private == 6 * MIB
    assert worker.file == 320 * MIB


def test_private_is_bounded_by_anonymous_when_a_shared_file_is_written():
    writer = make_memory(rss=50 * MIB, pss=50 * MIB, private_dirty=40 * MIB, anonymous=10 * MIB)
    assert writer.private == 10 * MIB


def test_memory_without_an_anonymous_field_counts_private_dirty_as_private():
    fields = {"Rss": 8 * KIB, "Private_Dirty": 4 * KIB, "Private_Clean": 2 * KIB}
    stat = procfs.parse_stat(fixture_text(SLEEP_PID, "stat"))
    mem = ProcessMemory.from_proc(stat, fields, boot_time=BOOT_TIME, clock_ticks=100)
    assert (mem.private, mem.file) == (4 * KIB, 0)


@pytest.mark.parametrize("title, expected", [
    ("forkserve: master [app:app]", procfs.Title("master")),
    ("persondb: worker 12 [persondb.app:app] 3 req, 1.0 MiB private",
     procfs.Title("worker", worker_id=12, requests=3)),
    ("forkserve: worker 2 [app:app]", procfs.Title("worker", worker_id=2)),
    ("forkserve: generation 3 [app:app]", procfs.Title("master", generation=3)),
    ("a: b: supervisor [app:app] serving generation 4", procfs.Title("supervisor", serving=4)),
    ("forkserve: single [x]", procfs.Title("single")),
    ("forkserve: single [x] 12 req", procfs.Title("single", requests=12)),
    ("forkserve: generation 3 [x] 7 req", procfs.Title("master", generation=3, requests=7)),
    ("python -m forkserve app:app", None),
    ("sleep 100", None),
    ("", None),
])
def test_process_titles_say_role_worker_id_and_generation(title, expected):
    assert procfs.parse_title(title) == expected


def _tree(titles, children):
    return dict(title_of=lambda pid: procfs.parse_title(titles.get(pid)),
                children_of=lambda pid: children.get(pid, []))


def test_tree_after_a_reload_lists_supervisor_serving_then_draining_generation():
    titles = {1: "f: supervisor [a] serving generation 3", 20: "f: generation 2 [a]",
              30: "f: generation 3 [a]", 21: "f: worker 1 [a]", 31: "f: worker 1 [a]",
              32: "f: worker 2 [a] 5 req"}
    infos = model.tree_infos(1, **_tree(titles, {1: [20, 30], 20: [21], 30: [31, 32]}))
    assert [i.requests for i in infos] == [None, None, None, 5, None, None]  # from the title
    assert [(i.pid, i.label) for i in infos] == [
        (1, "supervisor"), (30, "master g3"), (31, "worker 1 g3"), (32, "worker 2 g3"),
        (20, "master g2 draining"), (21, "worker 1 g2 draining"),
    ]


def test_tree_with_a_starting_generation_and_untitled_processes():
    titles = {1: "f: supervisor [a] serving generation 2", 20: "f: generation 2 [a]",
              30: "f: generation 3 [a]"}
    infos = model.tree_infos(1, **_tree(titles, {1: [20, 30], 20: [21]}))
    assert [(i.pid, i.role, i.state) for i in infos] == [
        (1, "supervisor", None), (20, "master", "serving"), (21, "worker", "serving"),
        (30, "single", "starting"),
    ]
    titles[30] = "f: generation 3 [a] 40 req"  # a -w 0 generation counts its requests
    assert model.tree_infos(1, **_tree(titles, {1: [20, 30], 20: [21]}))[-1].requests == 40
    # Titles unreadable (setproctitle missing): the shape says it is a supervisor.
    untitled = model.tree_infos(1, **_tree({}, {1: [20], 20: [21, 22]}))
    assert [i.role for i in untitled] == ["supervisor", "master", "worker", "worker"]


def test_a_plain_master_and_its_workers_are_generation_1_as_the_stats_endpoint_says():
    titles = {1: "f: master [a]", 2: "f: worker 1 [a]", 3: "f: worker 2 [a]"}
    infos = model.tree_infos(1, **_tree(titles, {1: [2, 3]}))
    assert [(i.role, i.generation, i.state) for i in infos] == [
        ("master", 1, None), ("worker", 1, None), ("worker", 1, None)]
    titles = {1: "f: generation 3 [a]", 2: "f: worker 1 [a]"}  # one a reload started
    assert [i.generation for i in model.tree_infos(1, **_tree(titles, {1: [2]}))] == [3, 3]
    assert model.tree_infos(1, **_tree({}, {1: []}))[0].generation is None  # not forkserve's


def test_tree_of_a_master_handing_over_to_its_first_generation():
    titles = {1: "f: master [a] serving generation 2", 2: "f: worker 1 [a]",
              30: "f: generation 2 [a]", 31: "f: worker 1 [a]"}
    infos = model.tree_infos(1, **_tree(titles, {1: [2, 30], 30: [31]}))
    assert [(i.pid, i.label) for i in infos] == [
        (30, "master g2"), (31, "worker 1 g2"), (1, "master g1 draining"),
        (2, "worker 1 g1 draining"),
    ]
    titles[1] = "f: master [a]"  # generation 2 is not serving yet
    infos = model.tree_infos(1, **_tree(titles, {1: [2, 30], 30: [31]}))
    assert [(i.pid, i.label) for i in infos] == [
        (1, "master g1"), (2, "worker 1 g1"), (30, "master g2 starting"),
        (31, "worker 1 g2 starting"),
    ]


def test_tree_of_a_plain_master_is_master_and_workers_with_their_ids():
    titles = {1: "f: master [a]", 2: "f: worker 2 [a]", 3: "f: worker 1 [a]"}
    infos = model.tree_infos(1, **_tree(titles, {1: [2, 3], 2: [99]}))
    assert [(i.pid, i.label) for i in infos] == [(1, "master"), (2, "worker 2"),
                                                 (3, "worker 1")]


def test_ratio_after_a_reload_is_against_the_serving_master():
    memory = make_memory(rss=100 * MIB, pss=50 * MIB)
    small = make_memory(rss=10 * MIB, pss=10 * MIB)
    rows = (
        ProcessRow(ProcessInfo(1, "supervisor"), small, 1.0),
        ProcessRow(ProcessInfo(30, "master", generation=3, state="serving"), memory, 1.0),
        ProcessRow(ProcessInfo(31, "worker", generation=3, state="serving"), memory, 1.0),
        ProcessRow(ProcessInfo(20, "master", generation=2, state="draining"), memory, 1.0),
    )
    report = Report(rows, 0.0)
    assert report.master.info.pid == 30
    assert report.cost_ratio == pytest.approx(160 / 100)
    assert "other processes add 60.0 MiB to the master's (g3) 100.0 MiB of memory" in \
        render.format_table(report)
    text = render.to_prometheus(report)
    assert 'forkserve_process_private_bytes{role="master",generation="2"}' in text
    assert 'forkserve_process_info{role="master",generation="2",pid="20",state="draining"} 1' \
        in text


def test_json_from_a_server_without_the_anonymous_field_is_still_read():
    data = report_json.to_json(make_report())
    for entry in data["processes"]:
        for key in ("anonymous", "pss_anon", "pss_file", "state"):
            del entry[key]
    report = report_json.from_json(data)
    assert report.processes[0].memory.private == 10 * MIB


# -- Table ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "size, text",
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
     (260 * MIB + MIB // 10, "260.1 MiB"), (3 * 1024 * MIB, "3.0 GiB"), (-2 * MIB, "-2.0 MiB")],
)
def test_sizes_are_shown_in_binary_units(size, text):
    assert render.format_size(size) == text


@pytest.mark.parametrize(
    "seconds, text",
    [(0, "0s"), (42.9, "42s"), (303, "5m03s"), (7500, "2h05m"), (4 * 86400 + 3 * 3600, "4d03h")],
)
def test_uptime_is_shown_in_its_two_largest_units(seconds, text):
    assert render.format_duration(seconds) == text


def test_table_has_a_row_per_process_a_total_row_and_a_summary():
    lines = render.format_table(make_report()).splitlines()
    assert lines[0].split() == [
        "PID", "ROLE", "RSS", "PSS", "SHARED", "PRIVATE", "FILE", "SWAP", "MINFLT", "MAJFLT",
        "REQS", "UPTIME",
    ]
    assert lines[1].split() == [
        "100", "master", "100.0", "MiB", "40.0", "MiB", "90.0", "MiB", "10.0", "MiB", "20.0",
        "MiB", "0", "B", "5000", "3", "-", "1h02m",
    ]
    assert lines[2].split()[:3] == ["101", "worker", "1"]
    assert lines[2].split()[-2:] == ["1200", "1h01m"]
    assert lines[3].split()[-2:] == ["-", "1h01m"]
    assert lines[4].split() == [
        "total", "290.0", "MiB", "110.0", "MiB", "270.0", "MiB", "19.0", "MiB", "60.0", "MiB",
        "4.0", "KiB", "6350", "3", "1200",
    ]
    assert lines[5] == ("3 processes use 110.0 MiB: 100.0 MiB for one copy of the application, "
                        "5.0 MiB more for each of 2 workers")
    assert lines[6] == ("workers add 10.0 MiB to the master's 100.0 MiB of memory; serving "
                        "workers hold 9.0 MiB alone (their own allocations and any pages copied "
                        "from the master)")
    assert len(lines) == 7


def test_table_columns_line_up():
    lines = render.format_table(make_report()).splitlines()[:-2]
    header = lines[0]
    for column in ("RSS", "PSS", "SWAP", "MINFLT"):
        right_edge = header.index(column) + len(column)
        for line in lines[1:]:
            assert line[right_edge - 1] != " "
            assert right_edge == len(line) or line[right_edge] == " "


def test_table_summary_of_a_single_process_mentions_no_workers():
    row = make_report().processes[0]
    single = Report((ProcessRow(ProcessInfo(100, "single"), row.memory, row.uptime),), 0.0)
    summary = render.format_table(single).splitlines()[-1]
    assert summary == "1 process uses 40.0 MiB (a single process: nothing to share)"


def test_table_of_an_empty_report_says_the_server_has_exited():
    assert "exited" in render.format_table(Report((), 0.0))


def test_log_report_logs_each_process_then_the_summary(caplog):
    caplog.set_level("INFO", logger="test.memory")
    render.log_report(logging.getLogger("test.memory"), make_report())
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0] == (
        "Memory of master (pid 100): RSS 100.0 MiB, PSS 40.0 MiB, shared 90.0 MiB (90%), "
        "private 10.0 MiB, file 20.0 MiB, swap 0 B"
    )
    assert messages[1].startswith("Memory of worker 1 (pid 101): ")
    assert messages[3] == "Memory: " + "; ".join(
        render.format_table(make_report()).splitlines()[-2:])
    assert len(messages) == 4


# -- JSON ------------------------------------------------------------------------------


def test_json_round_trip_gives_back_the_same_report():
    report = make_report()
    served = json.loads(json.dumps(report_json.to_json(report)))
    assert report_json.from_json(served) == report


def test_json_keys_are_the_documented_ones():
    data = report_json.to_json(make_report())
    assert list(data) == ["schema", "time", "processes", "totals"]
    assert list(data["processes"][0]) == [
        "pid", "role", "worker_id", "generation", "state", "requests", "gc_collections",
        "gc_pause", "connections", "accepted", "start_time", "uptime",
        "rss", "pss", "shared_clean", "shared_dirty", "private_clean", "private_dirty", "swap",
        "anonymous", "pss_anon", "pss_file", "private", "file", "uss", "shared",
        "shared_fraction", "minor_faults", "major_faults",
    ]
    assert list(data["totals"]) == [
        "processes", "workers", "rss", "pss", "uss", "private", "file", "pss_file", "swap",
        "master_rss", "ratio_basis", "master_base", "total_base", "workers_cost", "copied",
        "cost_ratio", "minor_faults", "major_faults",
        "requests", "gc_collections", "gc_pause",
    ]
    assert (data["processes"][2]["private"], data["processes"][2]["file"]) == (4 * MIB, 20 * MIB)
    assert data["processes"][1]["worker_id"] == 1
    assert data["processes"][0]["worker_id"] is None
    assert data["totals"]["pss"] == 110 * MIB
    assert data["totals"]["workers"] == 2
    assert data["totals"]["cost_ratio"] == pytest.approx(1.1)


def test_json_of_a_report_without_master_has_null_cost():
    report = make_report()
    totals = report_json.to_json(Report(report.processes[1:], report.time))["totals"]
    assert totals["master_rss"] is None
    assert totals["workers_cost"] is None
    assert totals["cost_ratio"] is None


@pytest.mark.parametrize(
    "obj, message",
    [
        ([], "no list of processes"),
        ({"schema": 1, "time": 0}, "no list of processes"),
        ({"schema": 99, "time": 0, "processes": []}, "same forkserve version"),
        ({"schema": 1, "time": 0, "processes": [{"pid": 1}]}, "missing 'role'"),
        ({"schema": 1, "processes": []}, "missing 'time'"),
    ],
)
def test_from_json_rejects_what_is_not_a_report(obj, message):
    with pytest.raises(ValueError, match=message):
        report_json.from_json(obj)


def test_from_json_rejects_a_null_size():
    data = report_json.to_json(make_report())
    data["processes"][0]["pss"] = None
    with pytest.raises(ValueError, match="not a forkserve memory report"):
        report_json.from_json(data)


# -- Prometheus ---------------------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_VALUE = r"(?:[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf)|NaN)"
_SAMPLE = re.compile(rf"({_NAME})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? ({_VALUE})(?: -?\d+)?")
_HELP = re.compile(rf"# HELP ({_NAME}) (?:[^\\\n]|\\[\\n])*")
_TYPE = re.compile(rf"# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)")


def check_exposition(text):
    """Assert text is valid Prometheus text format 0.0.4; return {name: type}."""
    assert text.endswith("\n")
    helps, types, series, finished = set(), {}, set(), set()
    current = None
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            match = _HELP.fullmatch(line)
            assert match, line
            assert match[1] not in helps, f"HELP twice: {line}"
            assert match[1] not in types, f"HELP after TYPE: {line}"
            helps.add(match[1])
        elif line.startswith("# TYPE "):
            match = _TYPE.fullmatch(line)
            assert match, line
            assert match[1] not in types, f"TYPE twice: {line}"
            types[match[1]] = match[2]
        elif line.startswith("#") or not line:
            continue
        else:
            match = _SAMPLE.fullmatch(line)
            assert match, f"not a sample line: {line!r}"
            name = match[1]
            assert name in helps and name in types, f"sample before HELP/TYPE: {line}"
            if current != name:
                assert name not in finished, f"samples of {name} are not grouped"
                if current:
                    finished.add(current)
                current = name
            labels = tuple(sorted(re.findall(_LABEL, match[2] or "")))
            assert (name, labels) not in series, f"duplicate series: {line}"
            series.add((name, labels))
            if types[name] == "counter":
                assert name.endswith("_total"), name
    return types


def test_prometheus_text_is_valid_exposition_format():
    types = check_exposition(render.to_prometheus(make_report()))
    assert types["forkserve_process_pss_bytes"] == "gauge"
    assert types["forkserve_process_minor_faults_total"] == "counter"
    assert types["forkserve_process_requests_total"] == "counter"
    assert types["forkserve_server_pss_bytes"] == "gauge"


def test_prometheus_sizes_are_in_bytes_with_role_and_worker_labels_and_pids_in_an_info():
    text = render.to_prometheus(make_report(), prefix="app")
    assert 'app_process_pss_bytes{role="master"} 41943040\n' in text
    assert 'app_process_uss_bytes{role="worker",worker="1",generation="1"} 5242880\n' in text
    assert 'app_process_major_faults_total{role="master"} 3\n' in text
    assert 'app_process_info{role="worker",worker="1",generation="1",pid="101",state="serving"} 1\n' in text
    assert not [line for line in text.splitlines()
                if "pid=" in line and not line.startswith("app_process_info{")]
    assert "app_server_pss_bytes 115343360\n" in text
    assert "app_master_rss_bytes 104857600\n" in text
    assert "app_workers_cost_bytes 10485760\n" in text
    assert re.search(r"^app_cost_ratio 1\.1\d*$", text, re.MULTILINE)


def test_prometheus_leaves_out_unknown_values():
    report = make_report()
    text = render.to_prometheus(Report(report.processes[1:], report.time))
    check_exposition(text)
    assert 'requests_total{role="worker",worker="2",generation="1"}' not in text
    assert 'requests_total{role="worker",worker="1",generation="1"} 1200' in text
    assert not re.search(r"^forkserve_cost_ratio ", text, re.MULTILINE)


def test_prometheus_tells_a_draining_worker_from_its_replacement_of_the_same_number():
    report = make_report()
    leaving, staying = report.processes[1], report.processes[2]
    rows = (report.processes[0],
            ProcessRow(dataclasses.replace(leaving.info, state="draining"), leaving.memory, 1.0),
            ProcessRow(dataclasses.replace(staying.info, worker_id=1), staying.memory, 1.0))
    text = render.to_prometheus(Report(rows, report.time))
    check_exposition(text)  # no duplicate series
    assert 'forkserve_process_pss_bytes{role="worker",worker="1",generation="1"} 36700160' in text
    assert ('forkserve_process_pss_bytes{role="worker",worker="1",generation="1",'
            'state="draining"} 36700160') in text


def test_series_labels_fall_back_to_the_pid_when_titles_cannot_tell_workers_apart():
    twins = [ProcessInfo(7, "worker", 1, generation=2), ProcessInfo(8, "worker", 1, generation=2)]
    assert render.series_labels(twins) == [
        [("role", "worker"), ("worker", "1"), ("generation", "2")],
        [("role", "worker"), ("worker", "1"), ("generation", "2"), ("pid", "8")]]


def test_prometheus_of_an_empty_report_is_valid():
    check_exposition(render.to_prometheus(Report((), 0.0)))


def test_prometheus_rejects_a_prefix_that_is_not_a_metric_name():
    with pytest.raises(ValueError, match="not a valid Prometheus metric name"):
        render.to_prometheus(make_report(), prefix="fork-serve")


# -- Live processes ---------------------------------------------------------------------

# Allocates and touches MB of memory, forks N children, each of which
# touches 1 MB of its own; all then wait to be killed.
FORKING_PROGRAM = """
import os, signal, sys
workers, megabytes, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
shared = b"\\x01" * (megabytes << 20)

def announce(name):
    with open(os.path.join(ready, name + ".tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(ready, name + ".tmp"), os.path.join(ready, name))

for n in range(workers):
    if os.fork() == 0:
        private = b"\\x02" * (1 << 20)
        announce(f"worker-{n}")
        while True:
            signal.pause()
announce("master")
while True:
    signal.pause()
"""


@dataclasses.dataclass
class ForkedServer:
    pid: int
    worker_pids: list[int]
    spawned: float  # time.time() just before the master was started


@contextlib.contextmanager
def forked_server(tmp_path, workers, megabytes):
    ready = tmp_path / f"ready-{workers}"
    ready.mkdir()
    spawned = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-c", FORKING_PROGRAM, str(workers), str(megabytes), str(ready)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len([p for p in ready.iterdir() if p.suffix != ".tmp"]) < workers + 1:
            assert proc.poll() is None, f"forking program exited with {proc.returncode}"
            assert time.monotonic() < deadline, "forking program did not get ready in 60 s"
            time.sleep(0.02)
        worker_pids = sorted(int((ready / f"worker-{n}").read_text()) for n in range(workers))
        yield ForkedServer(proc.pid, worker_pids, spawned)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def server(tmp_path):
    with forked_server(tmp_path, workers=2, megabytes=32) as server:
        yield server


def independent_rollup(pid):
    """smaps_rollup (or summed smaps) read without forkserve's parser."""
    path = f"/proc/{pid}/smaps_rollup"
    if not os.path.exists(path):
        path = f"/proc/{pid}/smaps"
    fields = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB" and parts[0].endswith(":"):
                fields[parts[0][:-1]] = fields.get(parts[0][:-1], 0) + int(parts[1]) * 1024
    return fields


def assert_agrees_with_proc(mem, before):
    """Within 2% of the reading taken just before ours or of one just after."""
    after = independent_rollup(mem.pid)
    for field, attr in procfs.MEMORY_FIELDS:
        ours = getattr(mem, attr)
        low = min(before[field], after[field]) * 0.98
        high = max(before[field], after[field]) * 1.02
        assert low <= ours <= high, f"{attr} of {mem.pid}: {ours} outside [{low}, {high}]"


@linux_only
def test_read_process_agrees_with_smaps_rollup_of_live_processes(server):
    for pid in [server.pid] + server.worker_pids:
        before = independent_rollup(pid)
        mem = procfs.read_process(pid)
        assert mem.pid == pid
        assert_agrees_with_proc(mem, before)


@linux_only
def test_read_process_fault_counts_and_start_time_match_stat(server):
    mem = procfs.read_process(server.pid)
    with open(f"/proc/{server.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    assert mem.minor_faults == int(fields[7])
    assert mem.major_faults == int(fields[9])
    # btime is whole seconds, so the start time can be up to a second early.
    assert server.spawned - 1.5 < mem.start_time <= time.time()


@linux_only
def test_read_process_of_a_zombie_is_none():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while procfs.parse_stat(Path(f"/proc/{child.pid}/stat").read_bytes()).state != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert procfs.read_process(child.pid) is None
    finally:
        child.wait()
    assert procfs.read_process(child.pid) is None


@linux_only
def test_discover_finds_the_forked_children(server):
    infos = model.discover(server.pid)
    assert infos[0] == ProcessInfo(server.pid, "master")
    assert [(i.pid, i.role, i.worker_id) for i in infos[1:]] == [
        (pid, "worker", None) for pid in server.worker_pids
    ]


@linux_only
def test_discover_of_a_process_without_children_is_single(server):
    assert model.discover(server.worker_pids[0]) == [ProcessInfo(server.worker_pids[0], "single")]


@pytest.mark.memory
@linux_only
def test_collect_of_live_server_shows_workers_sharing_the_master_memory(server):
    befores = {pid: independent_rollup(pid) for pid in [server.pid] + server.worker_pids}
    report = model.collect(model.discover(server.pid))
    assert [row.info.pid for row in report.processes] == [server.pid] + server.worker_pids
    for row in report.processes:
        assert_agrees_with_proc(row.memory, befores[row.info.pid])
        assert 0 <= row.uptime < 120
    assert report.master_rss > 32 * MIB
    # Nothing shared would be about 3 (three copies); the 32 MB are shared.
    assert report.cost_ratio < 1.8
    for row in report.processes[1:]:
        assert row.memory.shared_fraction > 0.5


@linux_only
def test_reading_seventeen_processes_is_fast(tmp_path):
    with forked_server(tmp_path, workers=16, megabytes=16) as server:
        started = time.perf_counter()
        report = model.collect(model.discover(server.pid))
        elapsed = time.perf_counter() - started
    assert len(report.processes) == 17
    assert elapsed < 1.0


# -- The `forkserve memory` command ---------------------------------------------------------


@pytest.fixture
def pid_file(tmp_path, server):
    path = tmp_path / "forkserve.pid"
    path.write_text(f"{server.pid}\n")
    return path


@linux_only
def test_memory_command_prints_json_for_a_pid_file(pid_file, server, capsys):
    assert command.main(["--pid", str(pid_file), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["pid"] for p in data["processes"]] == [server.pid] + server.worker_pids
    assert [p["role"] for p in data["processes"]] == ["master", "worker", "worker"]
    assert data["totals"]["processes"] == 3
    assert data["totals"]["pss"] == sum(p["pss"] for p in data["processes"])
    assert data["totals"]["master_rss"] == data["processes"][0]["rss"]
    assert report_json.from_json(data).cost_ratio == pytest.approx(data["totals"]["cost_ratio"])


@linux_only
def test_memory_command_prints_a_table_by_default(pid_file, server, capsys):
    assert command.main(["--pid", str(pid_file)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["PID", "ROLE", "RSS"]
    assert lines[1].split()[:2] == [str(server.pid), "master"]
    assert re.match(r"3 processes use .*: .* for one copy of the application, .* more for "
                    r"each of 2 workers$", lines[-2])
    assert "of anonymous memory" in lines[-1]  # Linux >= 5.13; "of memory" before


def test_memory_command_without_pid_file_asks_whether_the_server_runs_with_pid(tmp_path, capsys):
    missing = tmp_path / "nope.pid"
    assert command.main(["--pid", str(missing)]) == 1
    assert f"is the server running with --pid {missing}?" in capsys.readouterr().err


def test_memory_command_with_a_stale_pid_says_the_server_stopped(tmp_path, capsys):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    path = tmp_path / "stale.pid"
    path.write_text(str(child.pid))
    assert command.main(["--pid", str(path)]) == 1
    assert "not running: the server has stopped" in capsys.readouterr().err


def test_memory_command_with_a_pid_file_holding_garbage_fails(tmp_path, capsys):
    path = tmp_path / "garbage.pid"
    path.write_text("hello\n")
    assert command.main(["--pid", str(path)]) == 1
    assert "does not hold a pid" in capsys.readouterr().err


def test_memory_command_naming_the_server_twice_is_a_usage_error(tmp_path, capsys):
    assert command.main(["123", "--stats", "127.0.0.1:9100"]) == 2
    assert "name the server once" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pid", "x", "--stats", "127.0.0.1:1"], "not allowed with"),
        (["--stats", "10.1.2.3:9100"], "loopback only"),
        (["--stats", "127.0.0.1"], "HOST:PORT"),
        (["--stats", "https://127.0.0.1:9100"], "only http://"),
        (["--stats", "unix:"], "socket path"),
        (["--pid", "x", "--watch", "0"], "positive number of seconds"),
        (["--pid", "x", "--watch", "soon"], "not a number of seconds"),
    ],
)
def test_memory_command_usage_errors_exit_2(argv, message, capsys):
    assert command.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "address, expected",
    [
        ("127.0.0.1:9100", ("127.0.0.1", 9100, None, "/json")),
        ("http://localhost:9100", ("localhost", 9100, None, "/json")),
        ("http://localhost:9100/", ("localhost", 9100, None, "/")),
        ("http://[::1]:9100/stats", ("::1", 9100, None, "/stats")),
        ("unix:/run/forkserve/stats.sock", (None, None, "/run/forkserve/stats.sock", "/json")),
    ],
)
def test_stats_addresses_in_every_accepted_form(address, expected):
    assert command.parse_stats_address(address) == expected


def test_memory_command_when_stats_endpoint_refuses_says_to_start_with_stats(capsys):
    with socket.socket() as bound_not_listening:
        bound_not_listening.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % bound_not_listening.getsockname()[1]
        assert command.main(["--stats", address]) == 1
    assert f"start the server with --stats {address}" in capsys.readouterr().err


def test_memory_command_when_stats_socket_is_missing_says_to_start_with_stats(tmp_path, capsys):
    address = f"unix:{tmp_path}/stats.sock"
    assert command.main(["--stats", address]) == 1
    assert f"start the server with --stats {address}" in capsys.readouterr().err


def captured_report():
    infos = [
        ProcessInfo(SLEEP_PID, "master"),
        ProcessInfo(OLD_KERNEL_PID, "worker", worker_id=0, requests=3),
    ]
    return model.collect(infos, now=BOOT_TIME + 3600.0, proc=DATA)


class StatsHandler(http.server.BaseHTTPRequestHandler):
    status = 200
    body = b""

    def do_GET(self):
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format, *args):
        pass

    def address_string(self):
        return "client"


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class TCPHTTPServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


@contextlib.contextmanager
def stats_endpoint(tmp_path, body, status=200, unix=False):
    handler = type("Handler", (StatsHandler,), {"status": status, "body": body})
    if unix:
        httpd = UnixHTTPServer(str(tmp_path / "stats.sock"), handler)
        address = f"unix:{tmp_path / 'stats.sock'}"
    else:
        httpd = TCPHTTPServer(("127.0.0.1", 0), handler)
        address = "127.0.0.1:%d" % httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield address
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_memory_command_renders_what_the_stats_endpoint_serves(tmp_path, unix, capsys):
    report = captured_report()
    body = json.dumps(report_json.to_json(report)).encode()
    with stats_endpoint(tmp_path, body, unix=unix) as address:
        assert command.main(["--stats", address]) == 0
        assert capsys.readouterr().out == render.format_table(report) + "\n"
        assert command.main(["--stats", address, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == report_json.to_json(report)


def test_memory_command_accepts_an_http_url_for_stats(tmp_path, capsys):
    report = captured_report()
    with stats_endpoint(tmp_path, json.dumps(report_json.to_json(report)).encode()) as address:
        assert command.main(["--stats", f"http://{address}"]) == 0
    assert "for one copy of the application" in capsys.readouterr().out


@pytest.mark.parametrize(
    "status, body, message",
    [(404, b"not here", "answered 404"), (200, b"<html>", "did not serve a memory report"),
     (200, b'{"processes": "x"}', "did not serve a memory report")],
)
def test_memory_command_explains_an_endpoint_that_is_not_the_stats_endpoint(
    tmp_path, status, body, message, capsys
):
    with stats_endpoint(tmp_path, body, status=status) as address:
        assert command.main(["--stats", address]) == 1
    err = capsys.readouterr().err
    assert message in err and "--stats address?" in err


def interrupt_after_frames(monkeypatch, frames):
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == frames:
            raise KeyboardInterrupt

    monkeypatch.setattr(command.time, "sleep", sleep)
    return sleeps


def test_memory_command_watch_refreshes_until_ctrl_c(tmp_path, monkeypatch, capsys):
    report = captured_report()
    sleeps = interrupt_after_frames(monkeypatch, frames=2)
    with stats_endpoint(tmp_path, json.dumps(report_json.to_json(report)).encode()) as address:
        assert command.main(["--stats", address, "--watch", "0.5"]) == 0
    out = capsys.readouterr().out
    assert sleeps == [0.5, 0.5]
    assert out.count("for one copy of the application") == 2
    assert "\x1b[2J" not in out  # not a tty: no clearing


def test_memory_command_watch_json_prints_one_document_per_line(tmp_path, monkeypatch, capsys):
    report = captured_report()
    interrupt_after_frames(monkeypatch, frames=3)
    with stats_endpoint(tmp_path, json.dumps(report_json.to_json(report)).encode()) as address:
        assert command.main(["--stats", address, "--json", "--watch", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert all(json.loads(line) == report_json.to_json(report) for line in lines)


# -- forkserve memory --why ------------------------------------------------------------

def test_why_reads_only_private_writable_mappings():
    maps = textwrap.dedent("""\
        55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0          [heap]
        7f0000000000-7f0000100000 rw-p 00000000 00:00 0
        7f0000100000-7f0000200000 r--p 00000000 08:01 42         /usr/lib/libc.so.6
        7f0000200000-7f0000300000 rw-s 00000000 08:01 43         /tmp/store
        7f0000300000-7f0000301000 rw-p 00010000 08:01 42         /usr/lib/libc.so.6
        """)
    assert copied_objects.parse_maps(maps) == [(0x55D0C0000000, 0x55D0C0021000),
                                    (0x7F0000000000, 0x7F0000100000),
                                    (0x7F0000300000, 0x7F0000301000)]


def test_why_keeps_present_anonymous_exclusive_pagemap_entries():
    present, exclusive, file_page = 1 << 63, 1 << 56, 1 << 61
    entries = [present | exclusive | 0x1234,  # copied: kept
               present | 0x99,  # still shared with the master
               present | exclusive | file_page,  # a file page only this process maps
               exclusive,  # not present (swapped out or never touched)
               present | exclusive]
    data = struct.pack(f"{len(entries)}Q", *entries)
    assert copied_objects.decode_pagemap(data, first_page=1000) == [1000, 1004]


def test_why_splits_each_page_evenly_among_the_object_headers_on_it():
    counts = {7: collections.Counter({(0, "dict"): 1, (0, "str"): 2, (1, "str"): 1}),
              9: collections.Counter({(1, "int"): 4})}
    by_root, by_type = copied_objects.attribute(counts, page_size=4096)
    assert by_root == {0: 3072, 1: 1024 + 4096}
    assert by_type == {"dict": 1024, "str": 3072, "int": 4096}


_COPIED = {}


@linux_only
@pytest.mark.usefixtures("single_threaded")  # forks this process: a master and its worker
def test_why_blames_the_copied_pages_on_the_module_global_that_holds_them():
    # A "master" (this process) holding a dataset; a "worker" forked from it
    # reads half the dataset (refcount writes copy those pages); an "auditor"
    # forked from the master walks and reads the worker's pagemap.
    _COPIED.clear()
    _COPIED.update((f"key{n}", [f"value {n}" * 4, n * 1.5]) for n in range(60_000))
    wrote_r, wrote_w = os.pipe()
    worker = os.fork()
    if worker == 0:
        os.close(wrote_r)
        touched = [value for n, value in enumerate(_COPIED.values()) if n % 2 == 0]
        os.write(wrote_w, b"1")
        signal.pause()
        os._exit(0)
    os.close(wrote_w)
    try:
        assert os.read(wrote_r, 1) == b"1"
        answer_r, answer_w = os.pipe()
        auditor = os.fork()
        if auditor == 0:
            os.close(answer_r)
            with os.fdopen(answer_w, "w") as out:
                json.dump(copied_objects.explain(worker, first_modules=[__name__]), out)
            os._exit(0)
        os.close(answer_w)
        with os.fdopen(answer_r) as source:
            answer = json.load(source)
        os.waitpid(auditor, 0)
    finally:
        os.close(wrote_r)
        os.kill(worker, signal.SIGKILL)
        os.waitpid(worker, 0)
        _COPIED.clear()
    top = answer["owners"][0]
    assert top["name"] == f"{__name__}._COPIED" and top["what"] == "dict of 60,000 entries"
    assert top["bytes"] > 0.5 * answer["on_objects_bytes"]
    assert answer["on_objects_bytes"] <= answer["exclusive_bytes"]
    assert "_COPIED: dict of 60,000 entries" in copied_objects.format_why(answer)


def test_why_names_the_objects_that_kept_much_of_the_shared_heap_mortal():
    answer = {"pid": 7, "exclusive_bytes": 8192, "on_objects_bytes": 4096, "owners": [],
              "types": [], "objects_walked": 10, "seconds": 0.5,
              "kept_mortal": {"objects": 200_345, "by": [
                  {"what": "zoneinfo.ZoneInfo(key='Europe/Paris')", "objects": 200_002}]}}
    assert ("Heap sharing kept 200,345 of the master's objects mortal (their finalisers run; "
            "workers copy them as they read them); most by: "
            "zoneinfo.ZoneInfo(key='Europe/Paris') (200,002).") in copied_objects.format_why(answer)
    assert "Heap sharing kept" not in copied_objects.format_why({**answer, "kept_mortal": None})


def test_why_points_a_worker_whose_own_memory_dominates_to_keep_mortal_when_shared():
    """What a worker stored in an immortal container is the worker's own
    memory: --why cannot name the container, so it says what would free it."""
    answer = {"pid": 7, "exclusive_bytes": 40 << 20, "on_objects_bytes": 4 << 20,
              "owners": [], "types": [], "objects_walked": 10, "seconds": 0.5,
              "kept_mortal": {"objects": 12, "by": []}}
    hint = "pass that container (or its module) to forkserve.keep_mortal() at import"
    assert hint in copied_objects.format_why(answer)
    assert hint not in copied_objects.format_why({**answer, "kept_mortal": None})  # not shared
    assert hint not in copied_objects.format_why({**answer, "on_objects_bytes": 30 << 20})


class _Record:
    def __init__(self, n):
        self.name, self.tags = f"record {n}", {n, n + 1}


class _Slotted:
    __slots__ = ("pair",)

    def __init__(self, n):
        self.pair = (n, str(n))


_HEAP = {}


def _c_walk_or_skip():
    if copied_objects._c_walk() is None:
        pytest.skip("forkserve.memory._whywalk is not built: install forkserve with a C "
                    "compiler present (pip install -e .), and leave FORKSERVE_NO_C unset")


def _walk_both(pages, progress=None):
    results = {}
    for in_c in (False, True):
        roots, counts, walked = copied_objects.walk([__name__], pages, 12, progress, in_c=in_c)
        results[in_c] = ({page: dict(counter) for page, counter in counts.items()}, walked)
        del roots, counts
    return results


def test_why_walk_in_c_counts_what_the_python_walk_counts():
    _c_walk_or_skip()
    _HEAP.clear()
    _HEAP.update((f"key{n}", [_Record(n), _Slotted(n), frozenset({n * 0.5}), b"x" * (n % 7)])
                 for n in range(20_000))
    _HEAP["cycle"] = cycle = []
    cycle.append(cycle)
    try:
        pages = {id(value[n % 4]) >> 12 for n, value in enumerate(_HEAP.values()) if n % 3 == 0}
        _walk_both(pages)  # imports done and caches warm, so both walks see the same heap
        python, c = _walk_both(pages).values()
        assert c == python
        names = {name for counter in c[0].values() for (_, name) in counter}
        assert {"_Record", "_Slotted", "frozenset", "bytes"} <= names
        assert c[1] > 100_000
    finally:
        _HEAP.clear()


def test_why_walk_in_c_reports_progress_as_it_goes(monkeypatch):
    _c_walk_or_skip()
    monkeypatch.setattr(copied_objects, "PROGRESS_EVERY", 0.0)
    reported = []
    _, _, walked = copied_objects.walk([__name__], set(), 12, reported.append, in_c=True)
    assert len(reported) >= 2
    assert reported == sorted(reported) and 0 < reported[-1] <= walked


def test_why_walks_in_python_when_forkserve_no_c_is_set(monkeypatch):
    _c_walk_or_skip()
    monkeypatch.setenv("FORKSERVE_NO_C", "1")
    assert copied_objects._c_walk() is None


def test_why_walk_in_c_refuses_a_page_shift_that_is_no_page_size():
    _c_walk_or_skip()
    from forkserve.memory import _whywalk

    with pytest.raises(ValueError, match="page_shift 0"):
        _whywalk.walk([], set(), 0, set(), None, 1.0)


# -- --worker-gc -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, policy", [("off", "off"), (" Young ", "young"), ("idle", "idle")])
def test_worker_gc_policy_names(text, policy):
    assert workergc.parse_policy(text) == policy


def test_worker_gc_policy_that_does_not_exist_lists_the_ones_that_do():
    with pytest.raises(ValueError, match="off, young, normal, idle"):
        workergc.parse_policy("sometimes")


def test_worker_gc_default_is_normal_and_auto_the_default_s_old_name_reads_as_it():
    assert workergc.DEFAULT == "normal"
    assert workergc.parse_policy("auto") == "normal"


def test_gc_stats_count_collections_and_their_pause():
    ticks = iter([100, 350, 1000, 1100])
    published = []
    stats = workergc.GcStats(lambda *figures: published.append(figures),
                             clock=lambda: next(ticks))
    stats("start", {"generation": 0})
    stats("stop", {"generation": 0, "collected": 3})
    stats("start", {"generation": 1})
    stats("stop", {"generation": 1, "collected": 0})
    assert (stats.collections, stats.pause_ns) == (2, 350)
    assert published == [(1, 250), (2, 350)]


@contextlib.contextmanager
def _gc_state():
    threshold, callbacks = gc.get_threshold(), list(gc.callbacks)
    worker_threshold = cow._state["threshold"]
    try:
        yield
    finally:
        gc.callbacks[:] = callbacks
        cow._state["threshold"] = worker_threshold
        gc.set_threshold(*threshold)


def test_worker_gc_young_collects_generations_0_and_1_and_check_keeps_it():
    with _gc_state():
        policy = workergc.apply("young")
        assert gc.get_threshold()[:2] == (700, 10) and gc.get_threshold()[2] > 10**6
        gc.set_threshold(0)  # a library turning collection off
        assert cow.check() is True
        assert gc.get_threshold()[0] == 700
        gc.collect(0)
        assert policy.stats.collections == 1 and policy.stats.pause_ns > 0


def test_worker_gc_idle_collects_only_when_no_request_came_since_the_last_tick():
    with _gc_state():
        policy = workergc.apply("idle")
        assert gc.get_threshold()[0] == 0
        policy.tick(requests=5)  # first tick: nothing to compare with
        policy.tick(requests=9)  # busy
        assert policy.stats.collections == 0
        held = [{} for _ in range(3)]  # something for generation 0 to hold
        assert held
        policy.tick(requests=9)  # idle since the last tick
        assert policy.stats.collections == 1


def test_memory_why_of_a_process_that_is_not_a_worker_says_what_to_give(capsys):
    # A process of its own: this one's title may have been set by a test
    # that built a Master in-process.
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert command.main(["--why", str(other.pid)]) == 1
    finally:
        other.stdin.close()
        other.wait()
    assert "is not a forkserve worker" in capsys.readouterr().err


def test_memory_why_of_a_pid_that_is_not_running_says_so(tmp_path, capsys):
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    assert command.main(["--why", str(exited.pid)]) == 1
    assert f"no process {exited.pid}" in capsys.readouterr().err


def test_stats_health_answers_from_the_servers_readiness_not_from_the_report():
    from forkserve.http import stats

    def no_report():
        raise AssertionError("/health must not read /proc")
    assert stats.respond("GET", "/health", no_report, ready=lambda: True)[0] == "200 OK"
    status, _, body = stats.respond("GET", "/health", no_report, ready=lambda: False)
    assert status == "503 Service Unavailable" and b"not serving" in body
    assert stats.respond("GET", "/health?x=1", no_report, ready=lambda: True)[0] == "200 OK"
    assert stats.respond("GET", "/livez", no_report, ready=lambda: False)[0] == "200 OK"


def test_worker_connection_counts_are_in_the_json_and_a_prometheus_gauge():
    report = make_report()
    worker = report.processes[1]
    counted = dataclasses.replace(worker, info=dataclasses.replace(worker.info, connections=3,
                                                                   accepted=41))
    report = Report((report.processes[0], counted) + report.processes[2:], report.time)
    data = json.loads(json.dumps(report_json.to_json(report)))
    assert (data["processes"][1]["connections"], data["processes"][1]["accepted"]) == (3, 41)
    assert data["processes"][2]["connections"] is None
    assert report_json.from_json(data) == report
    text = render.to_prometheus(report)
    assert check_exposition(text)["forkserve_process_connections"] == "gauge"
    assert 'forkserve_process_connections{role="worker",worker="1",generation="1"} 3\n' in text
    assert 'connections{role="worker",worker="2"' not in text
