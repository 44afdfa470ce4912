"""The `forkserve` command.

  forkserve [OPTIONS] MODULE:APP      serve an application (see --help)
  forkserve memory [...]              show a running server's memory
  forkserve store [...]               build, inspect and shard store files
"""

import sys

from forkserve.memory import cow
from forkserve import exits
from forkserve.config import settings

__all__ = ["main"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "memory":
        from forkserve.memory import command
        return command.main(argv[1:])
    if argv and argv[0] == "store":
        from forkserve.store import command
        return command.main(argv[1:], prog="forkserve store")
    try:
        cfg = settings.parse(argv)
    except settings.ConfigError as exc:  # every problem found, each on its own line
        for warning in exc.warnings:
            print(f"forkserve: warning: {warning}", file=sys.stderr)
        for error in str(exc).splitlines():
            print(f"forkserve: error: {error}", file=sys.stderr)
        return exits.CONFIG_ERROR
    if cfg.print_config:
        from forkserve.config import effective
        print(effective.render(cfg))
        return 0
    if not cfg.app:
        print("forkserve: error: no application given. Usage: forkserve [OPTIONS] MODULE:APP, "
              "e.g. forkserve -w 4 myproject.wsgi:application (see forkserve --help)",
              file=sys.stderr)
        return exits.CONFIG_ERROR
    from forkserve.process import boot
    status = boot.run(cfg)
    # The application may be loaded: end without interpreter finalization.
    cow.exit_process(status)
