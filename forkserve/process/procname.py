"""Process titles, so `ps` and `top` show what each forkserve process is."""

import setproctitle as _setproctitle

__all__ = ["title", "set_title", "Title"]


def title(prefix, role, app_name, detail=""):
    """'forkserve: worker 2 [persondb.app:app] 1203 req, 8.1 MiB private'"""
    text = f"{prefix or 'forkserve'}: {role} [{app_name}]"
    return f"{text} {detail}" if detail else text


def set_title(cfg, role, app_name, detail=""):
    _setproctitle.setproctitle(title(cfg.name, role, app_name, detail))


class Title:
    """One process's title: its role and application, and a detail (the
    requests served, the generation that serves) set again only when it
    changed, so a loop can show it on every turn."""

    def __init__(self, cfg, role, app_name):
        self.cfg = cfg
        self.role = role
        self.app_name = app_name
        self.shown = None  # the detail the title shows

    def show(self, detail=""):
        if detail != self.shown:
            self.shown = detail
            set_title(self.cfg, self.role, self.app_name, detail)
