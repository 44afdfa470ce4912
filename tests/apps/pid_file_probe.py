"""A logging handler for the pid file test: when the server logs "Listening at",
it notes whether the pid file (PROBE_PID_FILE) exists yet, in PROBE_OUT."""

import logging
import os


class Handler(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("Listening at"):
            with open(os.environ["PROBE_OUT"], "a") as out:
                out.write(f"{os.path.exists(os.environ['PROBE_PID_FILE'])}\n")
