"""Every setting forkserve has, declared once.

Each `Setting` names its command-line flags, its environment variable
(FORKSERVE_<NAME>), its config-file key (the name), its type, its default,
one line of help for --help, and the details --help leaves out (reasons,
edge cases, costs). The argument parser, the environment and config-file
readers and docs/settings.md's tables (help and details) are all derived
from `SETTINGS`; nothing else in the package lists settings.

Precedence, lowest first: defaults, config file, environment, command line.

This module only decides: it parses text into a `Config` and raises
`ConfigError` with a message that says what to do. It reads no files itself:
forkserve.config.files reads the config file it is asked to read.
"""

import argparse
import dataclasses
import difflib
import os
import shlex
import sys
from typing import Any, Callable

from forkserve.memory.workergc import DEFAULT as _WORKER_GC_DEFAULT
from forkserve.memory.workergc import parse_policy as _worker_gc_policy
from forkserve.config import gunicorn, uwsgi
from forkserve.config import files, values
from forkserve.config.values import ConfigError, Findings

__all__ = ["Setting", "SETTINGS", "Config", "ConfigError", "parse", "settings_table"]


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    flags: tuple
    convert: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str | None = None
    # "value" takes an argument; "flag" is a switch; "off" a switch that
    # turns an on-by-default setting off (--no-...); "switch" a pair of
    # flags (--x, --no-x) over a default that decides by itself; "append" repeats;
    # "optional" takes an argument or, alone, means "auto".
    kind: str = "value"
    section: str = "server"
    #: what --help leaves out: why, the edge cases, the costs; docs/settings.md
    #: gives it after the help line
    details: str = ""
    #: False: --help names the flag among Gunicorn's instead of describing it
    #: (a Gunicorn setting's tuning, under its Gunicorn name), to keep --help short
    in_help: bool = True

    @property
    def env(self) -> str:
        return "FORKSERVE_" + self.name.upper()

    def default_value(self):
        return self.default() if callable(self.default) else self.default

    def shown_default(self) -> str:
        if self.name == "workers":
            return "$WEB_CONCURRENCY, else the number of CPUs"
        value = self.default_value()
        if value is None:
            return "auto" if self.kind == "switch" else "(none)"
        if isinstance(value, list):
            return ",".join(value) or "(none)"
        if isinstance(value, dict):
            return ",".join(f"{key}={val}" for key, val in value.items())
        if isinstance(value, bool):
            return "off" if not value else "on"
        return str(value)


SETTINGS = (
    Setting("bind", ("-b", "--bind"), values.bind_list, lambda: ["127.0.0.1:8000"],
            "Listen on HOST:PORT, [IPv6]:PORT or unix:PATH; repeat for several.",
            metavar="ADDRESS", kind="append",
            details="Port 0 picks a free port (the real one is logged)."),
    Setting("workers", ("-w", "--workers"), values.whole(0), values.default_workers,
            "Number of forked worker processes. 0 serves from one process with no fork.",
            metavar="N"),
    Setting("worker_connections", ("--worker-connections",), values.whole(1), 1000,
            "Most simultaneous connections one worker serves (one greenlet each).",
            metavar="N"),
    Setting("no_balance", ("--no-balance",), values.flag, False,
            "Let workers race for new connections instead of sharing them evenly.",
            kind="flag",
            details="By default each worker pauses accept() while it holds more than its "
                    "share (plus an eighth) of the workers' open connections."),
    Setting("cpu_affinity", ("--cpu-affinity",), values.cpu_affinity, "auto",
            "Pin each worker to one CPU: on, off, or auto (only while workers outnumber CPUs).",
            metavar="auto|on|off",
            details="on: the workers spread evenly over the CPUs the server may use (a "
                    "replacement keeps its predecessor's CPU). auto: only while there are "
                    "more workers than those CPUs, where pinning cut p99 and raised req/s. "
                    "off: workers run on any of them, and may leave a CPU that other work "
                    "keeps busy."),
    # --no-yield-cpu: forkserve.process.cpu_turns holds why and what it costs.
    Setting("yield_cpu", ("--no-yield-cpu",), values.flag_on_by_default, True,
            "Do not have workers that share a CPU yield it between batches of requests.",
            kind="off",
            details="By default each worker (and a -w 0 process) calls sched_yield() before "
                    "its event loop polls, at most once every 0.5 ms, so processes that share "
                    "a CPU (more workers than CPUs) take turns a batch of requests at a time, "
                    "not a scheduler tick (4 ms) at a time: with 4 workers on one CPU, "
                    "PersonDB's p99 went from 13 to 6 ms at 64 connections and from 14 to 1 ms "
                    "at 8, requests per second within the noise. The call returns at once "
                    "when nothing else waits for the CPU."),
    Setting("backlog", ("--backlog",), values.whole(1), 2048,
            "Listen queue length: connections the kernel holds while workers are busy.",
            metavar="N"),
    Setting("timeout", ("--timeout",), values.seconds, 30.0,
            "A worker whose event loop is blocked this many seconds is killed and replaced. "
            "0 disables.", metavar="SECONDS"),
    Setting("graceful_timeout", ("--graceful-timeout",), values.seconds, 30.0,
            "How long in-flight requests may run after a graceful stop or restart.",
            metavar="SECONDS"),
    Setting("keep_alive", ("--keep-alive",), values.seconds, 5.0,
            "Seconds an idle keep-alive connection is kept open. 0 closes after each response.",
            metavar="SECONDS", section="http"),
    Setting("max_requests", ("--max-requests",), values.whole(0), 0,
            "Recycle a worker gracefully after it has served this many requests. 0 disables.",
            metavar="N",
            details="The replacement is forked at once; the worker serves on until it "
                    "serves, then drains. Workers that reach it together are replaced one "
                    "after the other, at most 10 a second: under sustained load a worker "
                    "may serve past N while it waits its turn (docs/reloads.md)."),
    Setting("max_requests_jitter", ("--max-requests-jitter",), values.whole(0), 0,
            "Add a random 0..N to each worker's --max-requests so they do not recycle together.",
            metavar="N"),
    Setting("pid", ("--pid",), values.text, None,
            "Write the master's PID to this file (removed on exit).", metavar="FILE"),
    Setting("name", ("-n", "--name"), values.text, None,
            "Prefix for process titles, e.g. 'persondb' gives 'persondb: worker 1 [app]'.",
            metavar="NAME"),
    Setting("access_logfile", ("--access-logfile",), values.text, None,
            "Write an access log line per request to FILE ('-' for stdout). Off by default.",
            metavar="FILE", section="logging"),
    Setting("error_logfile", ("--error-logfile",), values.text, "-",
            "Write the server log to FILE ('-' for stderr).", metavar="FILE", section="logging"),
    Setting("log_level", ("--log-level",), values.log_level, "info",
            "Server log level: debug, info, warning, error or critical.", metavar="LEVEL",
            section="logging"),
    Setting("config", ("-c", "--config"), values.text, None,
            "Read settings from a Python file (like gunicorn.conf.py) or a TOML file.",
            metavar="FILE",
            details="A TOML file's [tool.forkserve] table, or the whole file. "
                    "./forkserve.conf.py, else ./gunicorn.conf.py, is read when present and "
                    "no -c is given."),
    Setting("ini", ("--ini",), values.text, None,
            "Read a uWSGI ini file's [uwsgi] section (FILE:SECTION for another).",
            metavar="FILE",
            details="Its options become forkserve's settings, as docs/uwsgi.md lists (-c "
                    "reads a .ini file so too)."),
    Setting("check_config", ("--check-config",), values.flag, False,
            "Check the settings, load the application and exit: 0 if it would start, else 2.",
            kind="flag",
            details="Exit status 2 if a setting is refused or invalid. Every problem is "
                    "named in one run; settings with no effect are warnings."),
    Setting("print_config", ("--print-config",), values.flag, False,
            "Print every setting's value and where it came from, then exit.", kind="flag",
            details="The sources: default, config file, environment, command line. Exits 0 "
                    "without loading the application."),
    Setting("no_monkey_patch", ("--no-monkey-patch",), values.flag, False,
            "Do not call gevent.monkey.patch_all() before loading the application.",
            kind="flag"),
    # --no-c-local: forkserve.process.greenlet_local holds why and what it costs.
    Setting("c_local", ("--no-c-local",), values.flag_on_by_default, True,
            "Leave threading.local as gevent's greenlet-local, not forkserve's C one.",
            kind="off",
            details="After gevent's monkey-patching, threading.local is one namespace per "
                    "greenlet. By default forkserve puts its own C type there, before the "
                    "application is imported: the same behaviour at about a third of the "
                    "cost per attribute read, which is most of what gevent added to a Bottle "
                    "request (PersonDB's app: 15.0-15.7 µs a call with gevent's, 12.9-13.3 with forkserve's). No effect with "
                    "--no-monkey-patch, or where the C extension is not built."),
    Setting("chdir", ("--chdir",), values.text, None,
            "Change to this directory before loading the application.", metavar="DIR"),
    Setting("stats", ("--stats",), values.text, None,
            "Serve a memory dashboard, JSON, Prometheus text and /health at HOST:PORT.",
            metavar="ADDRESS", section="memory",
            details="Or unix:PATH. A live dashboard at /, JSON at /json (and /history), "
                    "Prometheus text at /metrics; /health says whether the workers serve "
                    "(200) or not (503), /livez whether the master runs."),
    Setting("memory_log_interval", ("--memory-log-interval",), values.seconds, 0.0,
            "Log every process's shared and private memory every this many seconds. 0 disables.",
            metavar="SECONDS", section="memory"),
    Setting("max_worker_memory", ("--max-worker-memory",), values.whole(0), 0,
            "Recycle a worker whose private memory (not RSS) passes this many MiB. 0 disables.",
            metavar="MB", section="memory",
            details="Private: its anonymous copy-on-write copies and its own allocations; "
                    "mapped file pages (a store) never count. The replacement starts first, "
                    "then the worker drains."),
    # --worker-gc: forkserve.memory.workergc holds the policies and their reasons.
    Setting("worker_gc", ("--worker-gc",), _worker_gc_policy, _WORKER_GC_DEFAULT,
            "How workers collect their own cyclic garbage: normal, young, idle or off.",
            metavar="POLICY", section="memory",
            details="normal: Python's thresholds, full collections included; young: "
                    "generations 0-1 only; idle: the young generations when no request came "
                    "in the last second; off: never. A -w 0 process follows it too. The "
                    "master's frozen heap is never collected."),
    # --no-take-free-space: forkserve.memory.free_space holds what it takes and its checks.
    Setting("take_free_space", ("--no-take-free-space",), values.flag_on_by_default, True,
            "Do not take the allocators' free space in the master before forking.",
            kind="off", section="memory",
            details="By default the master takes the free space between its objects before "
                    "each fork (at most 16 MiB at the first fork, 16 MiB more for respawns), "
                    "so that a worker's allocations do not copy the master's pages. Skipped, "
                    "with a log line, unless pymalloc without debug hooks, no tracemalloc and "
                    "glibc's malloc are in use."),
    # --share-heap: forkserve.memory.heap holds what it marks, what stays mortal and why.
    Setting("share_heap", ("--share-heap", "--no-share-heap"), values.auto_flag, None,
            "Make the master's heap immortal so workers' reads copy none of it (default: auto).",
            kind="switch", section="memory",
            details="Done once the application is loaded; objects whose death runs code "
                    "(finalisers, weakref callbacks, open files) and what holds them stay "
                    "mortal. On by default where it was checked (CPython 3.12-3.15), off "
                    "elsewhere with a log line; --share-heap refuses to start where it "
                    "cannot, --no-share-heap turns it off."),
    Setting("warmup", ("--warmup",), values.url_path_list, lambda: [],
            "GET this path in the master before forking, to build caches once; repeat for several.",
            metavar="PATH", kind="append", section="memory",
            details="In-process, three times (e.g. /, /products?page=2), so lazily built "
                    "caches and specialised bytecode are built once and shared. "
                    "Space-separated in the environment."),
    Setting("limit_request_line", ("--limit-request-line",), values.whole(0), 4094,
            "Longest request line in bytes; longer gets 414.",
            metavar="BYTES", section="http",
            details="CRLF not counted (as Gunicorn). At most 8190; 0 means no limit (a 1 MiB "
                    "ceiling remains)."),
    Setting("limit_request_fields", ("--limit-request-fields",), values.whole(0), 100,
            "Most header fields in a request; more gets 431. 0 means the maximum, 32768.",
            metavar="N", section="http"),
    Setting("limit_request_field_size", ("--limit-request-field_size", "--limit-request-field-size"),
            values.whole(0), 8190,
            "Largest header line in bytes; larger gets 431.",
            metavar="BYTES", section="http",
            details="Its CRLF counted (as Gunicorn). 0 means no limit (a 1 MiB ceiling "
                    "remains)."),
    Setting("limit_request_body", ("--limit-request-body",), values.whole(0), 0,
            "Largest request body in bytes; larger gets 413. 0 means no limit.",
            metavar="BYTES", section="http"),
    Setting("header_timeout", ("--header-timeout",), values.seconds, 10.0,
            "Seconds a client has to send the request line and headers.",
            metavar="SECONDS", section="http"),
    Setting("body_timeout", ("--body-timeout",), values.seconds, 30.0,
            "Seconds a client has to send the request body; 408 after. 0 disables.",
            metavar="SECONDS", section="http",
            details="Counted from the application's first read: bounds each wait and the "
                    "whole body; the connection is closed after the 408."),
    Setting("send_timeout", ("--send-timeout",), values.seconds, 30.0,
            "Seconds a client may go without taking a byte of the response. 0 disables.",
            metavar="SECONDS", section="http",
            details="A stall, not a download: a slow client that keeps reading finishes. "
                    "The connection is closed after, with a WARNING line."),
    Setting("sendfile", ("--no-sendfile",), values.flag_on_by_default, True,
            "Send wsgi.file_wrapper's files in blocks, not with os.sendfile().",
            kind="off", section="http",
            details="By default regular files go out with os.sendfile() (zero copy)."),
    # forkserve.http.transport.Outbox holds why and what it costs.
    Setting("batch_responses", ("--no-batch-responses",), values.flag_on_by_default, True,
            "Write each response at once, not with the others of its event loop's pass.",
            kind="off", section="http",
            details="By default a worker (and -w 0) writes the whole responses made in one pass "
                    "of its event loop (the requests that were ready together) when the pass "
                    "ends, before the loop polls: still one write(2) per response. Each response "
                    "written wakes a client (a proxy, a load generator) asleep waiting for one, "
                    "and on a virtual machine waking a process on another CPU goes through the "
                    "hypervisor: 9-10 µs of the server's CPU per PersonDB request on a 2-vCPU VM. "
                    "Written together, a pass's responses wake it once: PersonDB served 1.03-1.35x "
                    "the requests at 8, 64 and 256 connections, median p99 lower or level. "
                    "A response waits at most for the rest of its pass, and its connection "
                    "does not wait for the write: what it sends next, or its close, comes "
                    "after it."),
    Setting("user", ("-u", "--user"), values.name_or_id, None,
            "Switch workers to this user (name or uid) after the sockets are bound.",
            metavar="USER", section="security"),
    Setting("group", ("-g", "--group"), values.name_or_id, None,
            "Switch workers to this group (name or gid) after the sockets are bound.",
            metavar="GROUP", section="security"),
    # --- Gunicorn's settings forkserve honours under their Gunicorn names
    # (forkserve.config.gunicorn lists what happens to every Gunicorn setting) ---
    Setting("access_log_format", ("--access-logformat",), values.log_format,
            '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"',
            "Access log line, with Gunicorn's atoms; the default is Gunicorn's.",
            metavar="FORMAT", section="logging",
            details="Atoms: h l u t r m U q H s B b f a T D M L p, {header}i, {header}o, "
                    "{variable}e."),
    Setting("capture_output", ("--capture-output",), values.flag, False,
            "Send the application's stdout and stderr to the error log file.",
            kind="flag", section="logging"),
    Setting("logconfig", ("--log-config",), values.text, None,
            "Configure logging with logging.config.fileConfig(FILE).", metavar="FILE",
            section="logging",
            details="Its 'gunicorn.error' and 'gunicorn.access' loggers configure "
                    "forkserve's."),
    Setting("logconfig_dict", ("--log-config-dict",), values.json_mapping, None,
            "Configure logging with logging.config.dictConfig (JSON).", metavar="JSON",
            section="logging", details="Applied over Gunicorn's default dict."),
    Setting("logconfig_json", ("--log-config-json",), values.text, None,
            "Like --log-config-dict, read from a JSON file.", metavar="FILE",
            section="logging"),
    Setting("syslog", ("--log-syslog",), values.flag, False,
            "Also log to syslog (at syslog_addr), as Gunicorn.",
            kind="flag", section="logging",
            details="Through logging.handlers.SysLogHandler to syslog_addr, each line "
                    "tagged 'gunicorn.PREFIX.error:' or 'gunicorn.PREFIX.access:' and "
                    "'[pid]', as Gunicorn sends them; the log files or streams are kept."),
    Setting("syslog_addr", ("--log-syslog-to",), values.syslog_address,
            "udp://localhost:514", "Where syslog lines go: udp://HOST:PORT, tcp://HOST:PORT "
            "or unix://PATH.", metavar="ADDRESS", section="logging",
            details="unix://PATH#dgram forces a datagram socket (else a datagram, then a "
                    "stream socket is tried). Gunicorn's default on Linux.", in_help=False),
    Setting("syslog_prefix", ("--log-syslog-prefix",), values.optional_text, "",
            "The PREFIX in syslog tags (default: --name, else the application, ':' as '.').",
            metavar="PREFIX", section="logging", in_help=False),
    Setting("syslog_facility", ("--log-syslog-facility",), values.syslog_facility, "user",
            "Syslog facility: user, daemon, local0..local7...", metavar="FACILITY",
            section="logging", in_help=False),
    Setting("disable_redirect_access_to_syslog", ("--disable-redirect-access-to-syslog",),
            values.flag, False, "With --log-syslog, keep the access log out of syslog.",
            kind="flag", section="logging",
            details="Without it, syslog = True sends an access line per request to syslog, "
                    "as Gunicorn does, even with no --access-logfile.", in_help=False),
    Setting("statsd_host", ("--statsd-host",), values.statsd_address, None,
            "Send Gunicorn's statsd metrics to HOST:PORT (UDP).",
            metavar="ADDR", section="logging",
            details="gunicorn.requests, gunicorn.request.duration (ms), "
                    "gunicorn.request.status.CODE, gunicorn.workers and gunicorn.log.LEVEL, "
                    "with Gunicorn's names and types (forkserve.statsd). One non-blocking "
                    "datagram per metric; a send that fails is counted and dropped, never "
                    "waited for. --stats has forkserve's own figures."),
    Setting("statsd_prefix", ("--statsd-prefix",), values.optional_text, "",
            "Put this before every statsd metric name (a dot is added).", metavar="PREFIX",
            section="logging", in_help=False),
    Setting("dogstatsd_tags", ("--dogstatsd-tags",), values.optional_text, "",
            "Datadog tags added to every statsd metric, e.g. env:prod,service:api.",
            metavar="TAGS", section="logging", in_help=False),
    Setting("daemon", ("-D", "--daemon"), values.flag, False,
            "Detach into the background (without a supervisor).", kind="flag",
            details="As Gunicorn: two forks and setsid before anything else, standard "
                    "streams to /dev/null (set error_logfile, or enable_stdio_inheritance); "
                    "find the master by --pid. Under systemd or another supervisor, leave it "
                    "off."),
    Setting("enable_stdio_inheritance", ("-R", "--enable-stdio-inheritance"), values.flag,
            False, "With --daemon, keep stdout and stderr instead of /dev/null.", kind="flag",
            in_help=False),
    Setting("certfile", ("--certfile",), values.text, None,
            "Serve TLS on HTTP listeners with this certificate.", metavar="FILE",
            section="security",
            details="Read in the master at start (a bad file stops the start, named) and on "
                    "HUP; uwsgi listeners stay plain. docs/deployment.md says when to "
                    "terminate TLS here and when in a proxy."),
    Setting("keyfile", ("--keyfile",), values.text, None,
            "The certificate's private key (PEM), if not in --certfile.", metavar="FILE",
            section="security", in_help=False),
    Setting("ca_certs", ("--ca-certs",), values.text, None,
            "CA certificates (PEM) that client certificates are checked against.",
            metavar="FILE", section="security", in_help=False),
    Setting("cert_reqs", ("--cert-reqs",), values.cert_reqs, 0,
            "Client certificates: 0 not asked, 1 checked if sent, 2 required.",
            metavar="0|1|2", section="security", in_help=False),
    Setting("ciphers", ("--ciphers",), values.text, None,
            "OpenSSL cipher list for TLS 1.2 and older (default: Python's).",
            metavar="CIPHERS", section="security", in_help=False),
    Setting("do_handshake_on_connect", ("--do-handshake-on-connect",), values.flag, False,
            "Accepted for Gunicorn: the handshake always runs first, under header_timeout.",
            kind="flag", section="security", in_help=False),
    Setting("suppress_ragged_eofs", ("--suppress-ragged-eofs",), values.flag, True,
            "Treat a client's close without TLS close_notify as an end of file.",
            kind="flag", section="security",
            details="Off (config file or environment): such a close ends the connection "
                    "as a reset, so a request body cut short by it is not served.",
            in_help=False),
    Setting("raw_env", ("-e", "--env"), values.env_list, lambda: [],
            "Set an environment variable (KEY=VALUE) before the application loads. Repeat "
            "for several.", metavar="KEY=VALUE", kind="append"),
    Setting("pythonpath", ("--pythonpath",), values.text, None,
            "Comma-separated directories to put first on sys.path.", metavar="DIRS"),
    Setting("umask", ("-m", "--umask"), values.umask, 0,
            "File mode creation mask of the server (affects unix sockets, logs, pid file).",
            metavar="MASK", section="security"),
    Setting("forwarded_allow_ips", ("--forwarded-allow-ips",), values.allowed_addresses,
            lambda: os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1").split(","),
            "Peers trusted to set secure_scheme_headers: addresses, networks or '*'.",
            metavar="ADDRESSES", section="http",
            details="Networks in CIDR. Unix-socket peers are always trusted."),
    Setting("secure_scheme_headers", ("--secure-scheme-headers",), values.scheme_headers,
            lambda: {"X-FORWARDED-PROTOCOL": "ssl", "X-FORWARDED-PROTO": "https",
                     "X-FORWARDED-SSL": "on"},
            "Headers by which a trusted proxy says the request came over https.",
            metavar="NAME=VALUE,...", section="http",
            details="With one of them, wsgi.url_scheme becomes https. Contradicting headers "
                    "get 400."),
    Setting("proxy_protocol", ("--proxy-protocol",), values.proxy_protocol, "off",
            "Accept a PROXY protocol header: v1, v2 or auto (the bare flag).",
            metavar="MODE", kind="optional", section="http",
            details="Before a connection's first request, from proxy_allow_ips: it sets "
                    "REMOTE_ADDR and REMOTE_PORT."),
    Setting("load_progress_interval", ("--load-progress-interval",), values.seconds, 5.0,
            "While the application loads, log its progress every this many seconds.",
            metavar="SECONDS",
            details="The elapsed time and the master's RSS. 0 logs only the start and the "
                    "end."),
    Setting("reload", ("--reload",), values.flag, False,
            "Development tool: reload (as HUP) when a source file changes.", kind="flag",
            details="Polls every second."),
    Setting("reload_extra_files", ("--reload-extra-file",), values.path_list, lambda: [],
            "With --reload, also watch this file (templates, data). Repeat for several.",
            metavar="FILE", kind="append"),
    Setting("touch_reload", ("--touch-reload",), values.path_list, lambda: [],
            "Reload gracefully (as HUP) when this file's mtime changes; repeat for several.",
            metavar="FILE", kind="append", details="uWSGI's touch-reload."),
    Setting("reload_engine", ("--reload-engine",), values.reload_engine, "auto",
            "How --reload watches: auto or poll (forkserve always polls; inotify is refused).",
            metavar="ENGINE"),
    Setting("protocol", ("--protocol",), values.protocol, "http",
            "What a bind address without a uwsgi: or http: prefix speaks.",
            metavar="http|uwsgi", section="http",
            details="uwsgi is the binary protocol of nginx's uwsgi_pass (one request per "
                    "connection). -b uwsgi:127.0.0.1:3031 makes one listener speak uwsgi."),
    Setting("uwsgi_allow_ips", ("--uwsgi-allow-from",), values.allowed_addresses,
            lambda: ["127.0.0.1", "::1"],
            "Peers a uwsgi listener serves: addresses, networks or '*'.", metavar="ADDRESSES",
            section="http",
            details="Others are closed and logged. Unix-socket peers are always served."),
    Setting("proxy_allow_ips", ("--proxy-allow-from",), values.allowed_addresses,
            lambda: ["127.0.0.1", "::1"],
            "Peers allowed to send a PROXY protocol header (others get 403): addresses, "
            "networks or '*'.", metavar="ADDRESSES", section="http"),
)

BY_NAME = {setting.name: setting for setting in SETTINGS}


@dataclasses.dataclass
class Config:
    """The settings in force, plus the application spec. Built by `parse`."""
    app: str | None = None
    values: dict = dataclasses.field(default_factory=dict)
    sources: dict = dataclasses.field(default_factory=dict)
    #: server hooks from the config file, {name: function} (forkserve.process.hooks)
    hooks: dict = dataclasses.field(default_factory=dict)
    #: settings given that have no effect under forkserve, or that forkserve does
    #: differently, each with why (logged once at start)
    warnings: list = dataclasses.field(default_factory=list)

    def __getattr__(self, name):
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def with_values(self, **changes) -> "Config":
        values = dict(self.values)
        for name, raw in changes.items():
            values[name] = _convert(BY_NAME[name], raw, "argument")
        return Config(app=self.app, values=values, sources=dict(self.sources),
                      hooks=dict(self.hooks), warnings=list(self.warnings))


def _convert(setting: Setting, raw, where: str, findings=None):
    """The converted value; a bad one raises ConfigError, or with `findings`
    is recorded there and gives the default, so that reading goes on."""
    try:
        return setting.convert(raw)
    except ValueError as exc:
        message = f"{where}: {setting.flags[-1]} ({setting.name}): {exc}"
        if findings is None:
            raise ConfigError(message) from None
        findings.errors.append(message)
        return setting.default_value()


#: the --help sections, in this order (a section not named here comes after
#: them, titled after its name)
SECTION_TITLES = {"server": "Server", "http": "HTTP", "logging": "Logging",
                  "memory": "Memory", "security": "Security"}


def _section_title(section: str) -> str:
    return SECTION_TITLES.get(section, section.capitalize())


def build_parser(prog: str = "forkserve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=f"{prog} [OPTIONS] MODULE:APP\n"
              f"       {prog} memory [TARGET] [--why [TARGET]] [--json] [--watch SECONDS]\n"
              f"       {prog} store {{build,info,get,shard}} ... (see {prog} store --help)",
        description="Pre-fork gevent WSGI server whose workers share the master's preloaded data.",
        epilog="Every option can also be set in a config file (-c) by its name, or in the\n"
               "environment as FORKSERVE_<NAME>, e.g. FORKSERVE_WORKERS=4. Each setting in\n"
               "full (why, edge cases, costs): docs/settings.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # gunicorn.add_arguments wraps
    )
    parser.add_argument("app", nargs="?", metavar="MODULE:APP",
                        help="The WSGI application: module:attribute, or module:factory() to "
                             "call a factory (literal arguments allowed).")
    parser.add_argument("-V", "--version", action="version",
                        version="forkserve " + __import__("forkserve").__version__)
    groups = {section: parser.add_argument_group(title)
              for section, title in SECTION_TITLES.items()}
    for setting in SETTINGS:
        if setting.section not in groups:
            groups[setting.section] = parser.add_argument_group(_section_title(setting.section))
        group, dest = groups[setting.section], setting.name
        shown = setting.help if setting.in_help else argparse.SUPPRESS
        if setting.kind in ("flag", "off"):
            group.add_argument(*setting.flags, dest=dest, action="store_const",
                               const=setting.kind == "flag", default=None, help=shown)
        elif setting.kind == "switch":  # --x on, --no-x off, neither: the default decides
            group.add_argument(setting.flags[0], dest=dest, action="store_const", const=True,
                               default=None, help=shown)
            group.add_argument(setting.flags[1], dest=dest, action="store_const", const=False,
                               default=None, help=f"Turn {setting.flags[0]} off.")
        elif setting.kind == "optional":  # the flag alone means "auto"
            group.add_argument(*setting.flags, dest=dest, nargs="?", const="auto",
                               default=None, metavar=setting.metavar, help=shown)
        elif setting.kind == "append":
            group.add_argument(*setting.flags, dest=dest, action="append", default=None,
                               metavar=setting.metavar, help=shown)
        else:
            group.add_argument(*setting.flags, dest=dest, default=None,
                               metavar=setting.metavar, help=shown)
    gunicorn.add_arguments(parser, {flag for setting in SETTINGS for flag in setting.flags},
                           [flag for setting in SETTINGS if not setting.in_help
                            for flag in setting.flags])
    return parser


def parse(argv, environ=None, cwd=None) -> Config:
    """Turn command-line arguments, environment and config file into a Config.

    Every problem is found in one pass: a ConfigError names them all (and
    carries the warnings); without errors, the Config's `warnings` name the
    settings that have no effect."""
    environ = os.environ if environ is None else environ
    cwd = os.getcwd() if cwd is None else cwd
    parser = build_parser()
    findings = Findings()
    # uWSGI's long options (--socket, --master...) go through its table
    argv, uwsgi_flags = uwsgi.split_flags(list(argv), _flag_names())
    cli = _command_line(parser, argv, "command line", findings)
    if uwsgi_flags:
        _add_uwsgi_flags(cli, uwsgi_flags, cwd, findings)
    # FORKSERVE_CMD_ARGS works like GUNICORN_CMD_ARGS: flags that the command
    # line overrides and that override everything else.
    env_cli = _command_line(parser, shlex.split(environ.get("FORKSERVE_CMD_ARGS", "")),
                            "environment FORKSERVE_CMD_ARGS", findings)

    # a uWSGI ini file (forkserve.config.uwsgi)
    ini = cli.get("ini") or env_cli.get("ini") or environ.get(BY_NAME["ini"].env)
    if ini and (cli.get("config") or env_cli.get("config")):
        findings.errors.append(f"both --ini {ini} and -c were given; forkserve reads one "
                               "config file: drop one")
    config_path = ini or cli.get("config") or env_cli.get("config") or \
        environ.get("FORKSERVE_CONFIG")
    found = None
    for default_file in ("forkserve.conf.py", "gunicorn.conf.py"):  # Gunicorn reads the latter
        if config_path is None and os.path.isfile(os.path.join(cwd, default_file)):
            config_path = found = os.path.join(cwd, default_file)
    file_values = {}
    if config_path:
        try:
            file_values = files.read_config_file(config_path, set(BY_NAME), findings,
                                                 ini=bool(ini), environ=environ)
        except ConfigError as exc:  # the file could not be read at all: named with the rest
            findings.errors.append(str(exc))

    values, sources = {}, {}
    for setting in SETTINGS:
        if setting.name in cli:
            raw, source = cli[setting.name], "command line"
        elif setting.name in env_cli:
            raw, source = env_cli[setting.name], "environment FORKSERVE_CMD_ARGS"
        elif setting.env in environ:
            raw, source = environ[setting.env], f"environment {setting.env}"
        elif setting.name in file_values:
            raw, source = file_values[setting.name], f"config file {config_path}"
        else:
            values[setting.name] = setting.default_value()
            sources[setting.name] = "default"
            continue
        values[setting.name] = _convert(setting, raw, source, findings)
        sources[setting.name] = source
    if config_path:
        values["config"] = config_path
    if found:
        sources["config"] = "found in the working directory"
    elif ini:
        sources["config"] = "--ini"

    for app, source in ((cli.get("app"), "command line"),
                        (env_cli.get("app"), "environment FORKSERVE_CMD_ARGS"),
                        (environ.get("FORKSERVE_APP"), "environment FORKSERVE_APP"),
                        (file_values.get("app"), f"config file {config_path}"),
                        (None, "not given")):
        if app:
            break
    sources["app"] = source
    findings.check()
    return Config(app=app, values=values, sources=sources,
                  hooks=file_values.get("hooks", {}), warnings=findings.warnings)


def _flag_names() -> set:
    return {"-h", "--help", "-V", "--version",
            *(flag for setting in SETTINGS for flag in setting.flags),
            *(flag for row in gunicorn.ROWS for flag in row.flags)}


def _add_uwsgi_flags(cli, pairs, cwd, findings):
    """Add uWSGI options given as flags to `cli` (forkserve's own flags win; a
    listener or variable adds to theirs); their errors and warnings to findings."""
    result = uwsgi.translate_flags(pairs, cwd)
    findings.errors += result.errors  # each names the flag and what to do
    findings.warnings += result.warnings
    for name, value in result.values.items():
        if isinstance(value, list):
            cli[name] = list(cli.get(name) or []) + value
        else:
            cli.setdefault(name, value)


def _command_line(parser, argv, where, findings) -> dict:
    """{setting: raw value} given on a command line, Gunicorn's flags translated;
    unknown and refused flags go to `findings`."""
    known, unknown = parser.parse_known_args(argv)
    # each unknown flag (a value after one is not named again), or a stray argument
    findings.errors += [f"{where}: {_unknown_argument(argument)}"
                        for index, argument in enumerate(unknown)
                        if argument.startswith("-") or index == 0]
    given = {name: value for name, value in vars(known).items() if value is not None}
    for dest in [dest for dest in given if dest.startswith(gunicorn.DEST_PREFIX)]:
        name = dest[len(gunicorn.DEST_PREFIX):]
        try:
            translated, warning = gunicorn.translate(name, given.pop(dest))
        except ValueError as exc:
            findings.errors.append(f"{where}: {exc}")
            continue
        if warning:
            findings.warnings.append(f"{where}: {warning}")
        if translated is not None:
            given.setdefault(translated[0], translated[1])
    return given


def _unknown_argument(argument: str) -> str:
    """What to say about an argument the parser does not know."""
    if not argument.startswith("-"):
        return (f"unexpected argument {argument!r}: give one MODULE:APP, after the options "
                "(see forkserve --help)")
    flag = argument.partition("=")[0]
    flags = ["--help", "--version", *(flag for setting in SETTINGS for flag in setting.flags),
             *(flag for row in gunicorn.ROWS for flag in row.flags)]
    close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.7)
    hint = f"; did you mean {close[0]}?" if close else " (see forkserve --help)"
    return f"unknown option {flag}{hint}"


def settings_table() -> str:
    """docs/settings.md's settings tables, one per section, in Markdown."""
    sections = dict.fromkeys(setting.section for setting in SETTINGS)  # in declared order
    lines = []
    for section in sections:
        title = _section_title(section)
        lines += ["" if lines else None, f"**{title}**", "",
                  "| Setting (config key) | Flag | Environment | Default | What it does |",
                  "|---|---|---|---|---|"]
        for setting in (s for s in SETTINGS if s.section == section):
            flag = " / ".join(f"`{flag}`" for flag in setting.flags
                              if not flag.endswith("_size"))
            what = f"{setting.help} {setting.details}".strip()
            lines.append(f"| `{setting.name}` | {flag} | `{setting.env}` "
                         f"| {setting.shown_default()} | {what} |")
    return "\n".join(line for line in lines if line is not None)


if __name__ == "__main__":  # python -m forkserve.config.settings prints docs/settings.md's table
    sys.stdout.write(settings_table() + "\n")
