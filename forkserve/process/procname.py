"""Process titles, so `ps` and `top` show what each forkserve process is."""

import setproctitle as _setproctitle

__all__ = ["title", "set_title"]


def title(prefix, role, app_name, detail=""):
    """'forkserve: worker 2 [persondb.app:app] 1203 req, 8.1 MiB private'"""
    text = f"{prefix or 'forkserve'}: {role} [{app_name}]"
    return f"{text} {detail}" if detail else text


def set_title(cfg, role, app_name, detail=""):
    _setproctitle.setproctitle(title(cfg.name, role, app_name, detail))
