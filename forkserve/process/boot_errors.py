"""Where a worker leaves the error that stopped it booting, for the master.

A worker that fails to boot (the application or a post_fork/post_worker_init
hook raising, its own start-up code failing) logs its traceback and exits
WORKER_BOOT_ERROR; the master, which stops after a few such failures in a
row, quotes the last line of that traceback in its stop message, so the
reason is on the line that says the server stopped.

Invariants:
- The master maps the area before forking; each worker writes only its own
  slot, once, just before it exits; the master reads a slot only after
  reaping its worker (so never while it is written) and clears it then.
- A slot holds at most `size` bytes of UTF-8 text; longer errors are cut.
"""

import mmap

__all__ = ["BootErrors"]


class BootErrors:
    #: bytes per slot: one exception line (type and message), cut beyond
    size = 256

    def __init__(self, capacity):
        self.capacity = capacity
        # anonymous and shared: pages no worker writes cost nothing
        self._mem = mmap.mmap(-1, capacity * self.size)

    def write(self, index, text):
        """In the worker: leave `text` (cut to fit, on a character boundary)."""
        data = text.encode("utf-8", "replace")[:self.size]
        data = data.decode("utf-8", "ignore").encode("utf-8")
        start = index * self.size
        self._mem[start:start + self.size] = data.ljust(self.size, b"\0")

    def take(self, index):
        """In the master, once the worker is reaped: its text ("" if none), cleared."""
        start = index * self.size
        data = self._mem[start:start + self.size]
        self._mem[start:start + self.size] = bytes(self.size)
        return data.rstrip(b"\0").decode("utf-8", "replace")

    def close(self):
        self._mem.close()
