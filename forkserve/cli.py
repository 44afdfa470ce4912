"""The `forkserve` command.

  forkserve [OPTIONS] MODULE:APP      serve an application (see --help)
  forkserve memory [...]              show a running server's memory
"""

import sys

from forkserve import cow, exits, settings

__all__ = ["main"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "memory":
        from forkserve import memory
        return memory.main(argv[1:])
    try:
        cfg = settings.parse(argv)
    except settings.ConfigError as exc:
        print(f"forkserve: error: {exc}", file=sys.stderr)
        return exits.CONFIG_ERROR
    if not cfg.app:
        print("forkserve: error: no application given. Usage: forkserve [OPTIONS] MODULE:APP, "
              "e.g. forkserve -w 4 myproject.wsgi:application (see forkserve --help)",
              file=sys.stderr)
        return exits.CONFIG_ERROR
    from forkserve import runner
    status = runner.run(cfg)
    # The application may be loaded: end without interpreter finalization.
    cow.exit_process(status)
