"""What the pure decisions ask a server process to do: one vocabulary.

forkserve.process.lifecycle (the workers, as the master sees them) and
forkserve.process.handover (the generations of a reload) decide without
I/O: an event goes in, a list of these actions comes out. One place
carries them out, `Driver.apply` (forkserve.process.driver), for the
master, the single-process server and the supervisor alike.

Invariants:
- An action is a frozen value: it names what to do and to whom, never how.
  Two actions are equal when their type and fields are, so a unit test
  compares a decision's list with the list it expects.
- A list is carried out in its order, all of it: a decision that logs why
  it kills puts the Log before the Kill. Only Halt ends a list early (it
  raises exits.HaltServer), and a Fork that fails skips the Forks after it
  in the same list (the lifecycle asks again on a later turn).
- Whom an action addresses says which kind it is: a worker by its pid
  (Fork, Kill), a generation by its number (Spawn, Retire, Stop, ForceOut,
  Forward, BecomeSupervisor), or the process itself (Log, Notify, Announce,
  Halt). A generation's number may be the process's own (`Handover.owner`):
  then ForceOut and Forward are for the process's own workers.
"""

import dataclasses

from forkserve import exits

__all__ = ["Fork", "Kill", "Announce", "Spawn", "Retire", "Stop", "ForceOut", "Forward",
           "BecomeSupervisor", "Notify", "Log", "Halt"]

_action = dataclasses.dataclass(frozen=True)

# --- the workers (forkserve.process.lifecycle) ---


@_action
class Fork:
    """Fork one worker, then tell the lifecycle `forked()` (or stop forking for this list)."""


@_action
class Kill:
    """Send `signum` to worker `pid`."""
    pid: int
    signum: int


@_action
class Announce:
    """Every worker of the target was ready once: tell systemd and the supervisor."""


# --- the generations (forkserve.process.handover) ---


@_action
class Spawn:
    """Start generation `number` (fork + exec, adopting the listeners)."""
    number: int


@_action
class Retire:
    """Generation `number` must drain and leave (SIGTERM)."""
    number: int


@_action
class Stop:
    """Stop generation `number`; mode is "graceful" (SIGTERM) or "fast" (SIGQUIT)."""
    number: int
    mode: str


@_action
class ForceOut:
    """Generation `number` overstayed its deadline: force it out.

    First a fast stop (SIGQUIT: its master kills its own workers); `hard`
    when that was ignored for handover.KILL_GRACE seconds: SIGKILL.
    """
    number: int
    hard: bool = False


@_action
class Forward:
    """One TTIN or TTOU (`signum`) for generation `number`: to its process, or,
    when it is the owner's, to the owner's own workers."""
    number: int
    signum: int


@_action
class BecomeSupervisor:
    """The hand-over is done: exec into the supervisor of generation `number`
    (which tells systemd READY=1); `workers` TTIN (or, negative, TTOU) are
    still to be forwarded to it."""
    number: int
    reload_again: bool
    workers: int = 0


# --- the process itself ---


@_action
class Notify:
    """Tell systemd, e.g. "RELOADING=1"."""
    state: str


@_action
class Log:
    level: int
    message: str


@_action
class Halt:
    """Give up: stop the server with `status` (exits.HaltServer)."""
    reason: str
    status: int = exits.WORKER_BOOT_ERROR
