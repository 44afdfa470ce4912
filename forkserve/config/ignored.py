"""Settings that are valid but would have no effect in this run.

A Gunicorn user must never find that something they set was silently
ignored. Values forkserve cannot honour at all are refused while the config
is read (forkserve.config.gunicorn); this module finds the combinations
that only this run makes moot, e.g. worker hooks in single-process mode.
The server logs each as a warning; --check-config fails on them.

Pure: a Config and the environment in, messages out.
"""

__all__ = ["check"]

#: hooks that run only when there are forked workers (not with -w 0)
_WORKER_HOOKS = ("pre_fork", "post_fork", "post_worker_init", "worker_int", "worker_abort",
                 "worker_exit", "child_exit", "nworkers_changed")


def check(cfg, environ, pid) -> list:
    messages = []
    if cfg.workers == 0:
        for name in _WORKER_HOOKS:
            if name in cfg.hooks:
                messages.append(f"the {name} hook never runs with -w 0 (no worker processes); "
                                "use -w 1 or more, or drop the hook")
        if cfg.cpu_affinity == "on":
            messages.append("--cpu-affinity pins worker processes and -w 0 has none; pin the "
                            "one process with taskset instead, or use -w 1 or more")
    if "worker_abort" in cfg.hooks and cfg.workers and not cfg.timeout:
        messages.append("the worker_abort hook never runs with --timeout 0; set a timeout")
    systemd = environ.get("LISTEN_FDS") and environ.get("LISTEN_PID") == str(pid)
    if systemd and not environ.get("FORKSERVE__FDS") and cfg.sources.get("bind", "default") \
            != "default":
        messages.append(f"bind ({', '.join(cfg.bind)}, from {cfg.sources['bind']}) is "
                        f"ignored: systemd passed {environ['LISTEN_FDS']} listening socket(s) "
                        "(socket activation), and forkserve serves those; set the addresses "
                        "in the .socket unit's ListenStream= and drop --bind")
    return messages
