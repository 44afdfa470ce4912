"""Reading a process's memory and fault counts from /proc (Linux only).

The parsers (``parse_*``) are pure: text in, numbers out. The readers
(``read_*``, ``child_pids``) do the I/O and hand the text to them.

Invariants:

- Sizes are bytes. /proc prints kB (meaning KiB), so every size is x 1024.
- A process that exits while we read it is not an error: the readers return
  None (or leave it out) on ENOENT/ESRCH, and treat a zombie as gone.
  Anything else, notably EACCES when reading another user's process, is
  raised for the caller to explain.
- /proc/PID/smaps_rollup (Linux >= 4.14) is one page-table walk summed by
  the kernel. Older kernels only have /proc/PID/smaps, one block per
  mapping; we sum it with one regex pass, about 10 us per mapping.
- What a worker *copied* is its anonymous private memory: see
  ProcessMemory.private. File-backed pages (the mapped store, libraries)
  live in the page cache, are shared through it, and the kernel can drop
  the clean ones at any time; they are reported apart (ProcessMemory.file).
- Either way the kernel's walk dominates: it visits every resident page to
  share it out for Pss (about 12 ms per GiB of 4 KiB pages on a 2-vCPU VM;
  Python adds about 0.15 ms per process). That cost is the kernel's, and
  grows with resident memory times processes.
"""

import dataclasses
import errno
import functools
import os
import re
import socket

__all__ = [
    "MEMORY_FIELDS",
    "ProcStat",
    "ProcessMemory",
    "Title",
    "boot_time",
    "child_pids",
    "parse_title",
    "read_title",
    "parse_boot_time",
    "parse_children",
    "parse_smaps",
    "parse_smaps_rollup",
    "parse_stat",
    "parse_statm_anonymous",
    "read_process",
    "read_stat",
    "SHORTAGE_ERRNOS",
]

PROC = "/proc"

#: The smaps fields a ProcessMemory keeps, as (field name, attribute name).
MEMORY_FIELDS = (
    ("Rss", "rss"),
    ("Pss", "pss"),
    ("Shared_Clean", "shared_clean"),
    ("Shared_Dirty", "shared_dirty"),
    ("Private_Clean", "private_clean"),
    ("Private_Dirty", "private_dirty"),
    ("Swap", "swap"),
    ("Anonymous", "anonymous"),
    ("Pss_Anon", "pss_anon"),  # Linux >= 5.13; 0 before
    ("Pss_File", "pss_file"),  # Linux >= 5.13; 0 before
)

# Errors meaning "that process is gone". ESRCH is what reading
# smaps_rollup of a process that has already exited (mm released) gives.
_VANISHED_ERRNOS = frozenset({errno.ENOENT, errno.ESRCH})

#: Errors meaning "no descriptor or memory to read with, now": a reading
#: that fails with one of these is worth trying again later, and must not
#: stop a process that only reads for its bookkeeping.
SHORTAGE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})

# Zombie (exited, not yet reaped) and dead: no memory left to report.
_EXITED_STATES = frozenset({"Z", "X"})

# "Name:   1234 kB" at the start of a line. An smaps mapping header starts
# with "addr-addr", so it can never match, whatever its path says.
_KB_FIELD = re.compile(rb"^(\w+):[ \t]+(\d+) kB$", re.MULTILINE)

# Per-mapping attributes in smaps that are not amounts of memory; summing
# them is meaningless and smaps_rollup does not have them.
_PER_MAPPING_ONLY = frozenset({b"Size", b"KernelPageSize", b"MMUPageSize"})


def parse_smaps_rollup(text):
    """Return {field name: bytes} for every kB field of smaps_rollup text.

    Fields the kernel does not print (older kernels lack Pss_Dirty, SwapPss,
    ...) are simply absent; ProcessMemory treats them as 0.
    """
    return {
        name.decode(): int(kb) * 1024
        for name, kb in _KB_FIELD.findall(_as_bytes(text))
    }


def parse_smaps(text):
    """Sum /proc/PID/smaps over all mappings into smaps_rollup's shape."""
    values = {}  # field name -> its kB figures, one per mapping
    for name, kb in _KB_FIELD.findall(_as_bytes(text)):
        values.setdefault(name, []).append(kb)
    return {
        name.decode(): sum(map(int, kbs)) * 1024
        for name, kbs in values.items()
        if name not in _PER_MAPPING_ONLY
    }


def _as_bytes(text):
    # The readers hand over bytes (mapping paths need not be UTF-8);
    # callers with captured text may pass str.
    return text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text


@dataclasses.dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat that the reporter uses."""

    pid: int
    comm: str
    state: str
    ppid: int
    minflt: int
    majflt: int
    starttime_ticks: int


def parse_stat(text):
    """Parse one /proc/PID/stat line.

    comm sits in parentheses and may itself contain spaces, parentheses and
    even newlines, so it runs from the first "(" to the *last* ")"; the
    remaining fields are plain space-separated numbers.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    open_paren = text.find(" (")
    close_paren = text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}")
    rest = text[close_paren + 2 :].split()
    # rest[0] is field 3 (state) in proc(5)'s numbering.
    if len(rest) < 20:
        raise ValueError(f"/proc/PID/stat line too short: {text[:80]!r}")
    return ProcStat(
        pid=int(text[:open_paren]),
        comm=text[open_paren + 2 : close_paren],
        state=rest[0],
        ppid=int(rest[1]),
        minflt=int(rest[7]),
        majflt=int(rest[9]),
        starttime_ticks=int(rest[19]),
    )


def parse_statm_anonymous(text, page_size):
    """Resident anonymous bytes from /proc/PID/statm text: resident pages
    less the file and shmem ones (its "shared" field). Cheap to read: the
    kernel prints counters it keeps, it walks no pages (unlike smaps)."""
    fields = text.split(maxsplit=3)
    if len(fields) < 3:
        raise ValueError(f"not a /proc/PID/statm line: {text[:80]!r}")
    return (int(fields[1]) - int(fields[2])) * page_size


def parse_boot_time(text):
    """Return btime (boot time, epoch seconds) from /proc/stat text."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    for line in text.splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise ValueError("no btime line in /proc/stat")


def parse_children(text):
    """Parse /proc/PID/task/TID/children: space-separated pids (str or bytes)."""
    return [int(pid) for pid in text.split()]


@dataclasses.dataclass(frozen=True)
class ProcessMemory:
    """One process's memory (bytes), page faults and start time."""

    pid: int
    rss: int
    pss: int
    shared_clean: int
    shared_dirty: int
    private_clean: int
    private_dirty: int
    swap: int
    anonymous: int
    pss_anon: int
    pss_file: int
    minor_faults: int
    major_faults: int
    start_time: float  # epoch seconds; /proc/stat's btime makes it whole-second accurate

    @property
    def uss(self):
        """Unique set size (Private_Clean + Private_Dirty): every page only
        this process maps, file pages included."""
        return self.private_clean + self.private_dirty

    @property
    def private(self):
        """Anonymous private memory: the copy-on-write copies and new
        allocations of this process alone. forkserve reports and limits on it.

        smaps_rollup has no field that is exactly this, so it is
        min(Private_Dirty, Anonymous). Private_Dirty is every page only this
        process maps and has written: its anonymous pages (an anonymous page
        only exists once written; reading untouched memory maps the shared
        zero page), plus written pages of files it alone maps shared and
        writable (forkserve maps the store read-only, so none). Anonymous
        bounds it for the rare process that does write such files.
        Private_Clean is left out: those are file pages only this process
        has touched, which the kernel can drop and reread at any time.
        """
        return min(self.private_dirty, self.anonymous)

    @property
    def file(self):
        """Resident file-backed pages (Rss - Anonymous): the mapped store,
        libraries, shared memory. They live once in the page cache, however
        many processes map them, and the clean ones are reclaimable."""
        return max(0, self.rss - self.anonymous)

    @property
    def shared(self):
        return self.shared_clean + self.shared_dirty

    @property
    def shared_fraction(self):
        """Share of the resident pages that other processes also map."""
        return self.shared / self.rss if self.rss else 0.0

    @classmethod
    def from_proc(cls, stat, fields, boot_time, clock_ticks):
        """Build from a ProcStat, parsed smaps fields and the boot clock."""
        sizes = {attr: fields.get(name, 0) for name, attr in MEMORY_FIELDS}
        # Every kernel with smaps prints Anonymous; text without it (captured
        # or hand-made) reads as "all anonymous", so private is Private_Dirty.
        sizes["anonymous"] = fields.get("Anonymous", sizes["rss"])
        return cls(
            pid=stat.pid,
            minor_faults=stat.minflt,
            major_faults=stat.majflt,
            start_time=boot_time + stat.starttime_ticks / clock_ticks,
            **sizes,
        )


def read_stat(pid, *, proc=PROC):
    """Read /proc/PID/stat, or None if the process has exited."""
    try:
        stat = parse_stat(_read(f"{proc}/{pid}/stat"))
    except OSError as exc:
        if exc.errno in _VANISHED_ERRNOS:
            return None
        raise
    return None if stat.state in _EXITED_STATES else stat


def read_process(pid, *, proc=PROC):
    """Read one process's memory, or None if it has exited.

    PermissionError (another user's process) and other errors propagate.
    proc names the /proc tree to read (tests pass captured ones).
    """
    stat = read_stat(pid, proc=proc)
    if stat is None:
        return None
    try:
        fields = _read_memory_fields(f"{proc}/{pid}")
    except OSError as exc:
        if exc.errno in _VANISHED_ERRNOS:
            return None
        raise
    return ProcessMemory.from_proc(stat, fields, boot_time(proc), _clock_ticks())


def _read_memory_fields(directory):
    try:
        return parse_smaps_rollup(_read(f"{directory}/smaps_rollup"))
    except FileNotFoundError:
        # Kernel older than 4.14, or the process is gone: then reading
        # smaps fails with ENOENT too and the caller sees that.
        return parse_smaps(_read(f"{directory}/smaps"))


def child_pids(pid, *, proc=PROC):
    """Return the pids of pid's children, sorted.

    Uses /proc/PID/task/*/children where the kernel provides it
    (CONFIG_PROC_CHILDREN), else scans every /proc/*/stat for the ppid.
    """
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
    except OSError as exc:
        if exc.errno in _VANISHED_ERRNOS:
            return []
        raise
    children = set()
    try:
        for tid in tasks:
            children.update(parse_children(_read(f"{proc}/{pid}/task/{tid}/children")))
    except FileNotFoundError:
        # No CONFIG_PROC_CHILDREN, or a thread exited under us: the scan
        # is right in both cases, only slower.
        return _scan_children(pid, proc)
    return sorted(children)


def _scan_children(pid, proc):
    children = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            stat = parse_stat(_read(f"{proc}/{entry}/stat"))
        except OSError as exc:
            if exc.errno in _VANISHED_ERRNOS:
                continue
            raise
        if stat.ppid == pid:
            children.append(stat.pid)
    return sorted(children)


def parse_listening(text):
    """{socket inode: "HOST:PORT"} of the listening sockets in /proc/net/tcp or
    tcp6 text (addresses are hex, each 32-bit word in host byte order)."""
    found = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":  # 0A: TCP_LISTEN
            continue
        address, port = fields[1].split(":")
        raw = bytes.fromhex(address)
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
        if len(raw) == 4:
            host = socket.inet_ntop(socket.AF_INET, raw)
        else:
            host = "[" + socket.inet_ntop(socket.AF_INET6, raw) + "]"
        found[int(fields[9])] = f"{host}:{int(port, 16)}"
    return found


def parse_listening_unix(text):
    """{socket inode: "unix:PATH"} of the listening unix sockets in /proc/net/unix."""
    found = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        # Num RefCount Protocol Flags Type St Inode Path; flag 0x10000: __SO_ACCEPTCON
        if len(fields) >= 8 and int(fields[3], 16) & 0x10000:
            found[int(fields[6])] = "unix:" + fields[7]
    return found


def listening_addresses(pid, *, proc=PROC):
    """The addresses `pid` listens on, sorted; [] if it is gone or not ours to read."""
    try:
        inodes = set()
        for fd in os.listdir(f"{proc}/{pid}/fd"):
            try:
                target = os.readlink(f"{proc}/{pid}/fd/{fd}")
            except FileNotFoundError:  # that descriptor closed since the listing
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
        tables = {}
        for name, parse in (("tcp", parse_listening), ("tcp6", parse_listening),
                            ("unix", parse_listening_unix)):
            try:
                tables.update(parse(_read(f"{proc}/{pid}/net/{name}").decode()))
            except FileNotFoundError:  # no IPv6, or no /proc/net in this container
                continue
    except OSError as exc:
        if exc.errno in _VANISHED_ERRNOS or exc.errno == errno.EACCES:
            return []
        raise
    return sorted({tables[inode] for inode in inodes if inode in tables})


def read_title(pid, *, proc=PROC):
    """The process title (its cmdline, NULs as spaces), or None if it exited."""
    try:
        return _read(f"{proc}/{pid}/cmdline").replace(b"\0", b" ").decode(
            "utf-8", "replace").strip()
    except OSError as exc:
        if exc.errno in _VANISHED_ERRNOS:
            return None
        raise


# forkserve.process.procname's titles: "NAME: ROLE [APP] DETAIL", where ROLE
# is supervisor, master, single, "generation N" (a generation's master) or
# "worker N", and a supervisor's DETAIL is "serving generation N".
_TITLE = re.compile(
    r"(?:supervisor|master|single|generation (?P<generation>\d+)|worker (?P<worker>\d+))"
    r" \[[^\]]*\](?: serving generation (?P<serving>\d+)| (?P<requests>\d+) req\b)?")


@dataclasses.dataclass(frozen=True)
class Title:
    """What a forkserve process title says about the process."""

    role: str  # "supervisor" | "master" | "single" | "worker"
    worker_id: int | None = None
    generation: int | None = None  # of a generation's master
    serving: int | None = None  # the generation a supervisor serves
    requests: int | None = None  # a worker's or single process's, as its title last said


def parse_title(text):
    """Parse a forkserve process title; None if it is not one."""
    for match in _TITLE.finditer(text or ""):
        if text[: match.start()].endswith(": "):
            role = match.group(0).split(" ", 1)[0]
            number = functools.partial(_optional_int, match)
            if role == "generation":
                return Title("master", generation=number("generation"),
                             requests=number("requests"))  # a -w 0 generation's
            return Title(role, worker_id=number("worker"), serving=number("serving"),
                         requests=number("requests"))
    return None


def _optional_int(match, group):
    value = match.group(group)
    return None if value is None else int(value)


@functools.lru_cache(maxsize=8)
def boot_time(proc=PROC):
    """Boot time in epoch seconds (cached: it does not change while up)."""
    return parse_boot_time(_read(f"{proc}/stat"))


@functools.cache
def _clock_ticks():
    return os.sysconf("SC_CLK_TCK")


def _read(path):
    # Unbuffered: /proc files report size 0, and one readall() is the
    # fewest system calls for text the kernel generates on demand.
    with open(path, "rb", buffering=0) as f:
        return f.readall()
