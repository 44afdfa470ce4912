"""The basic app, with workers that read their memory for the process title
every 0.3 s instead of every 30 s: a fault test needs that periodic /proc
reading to happen while the worker is out of file descriptors."""

from basic import app  # noqa: F401
from forkserve.process.worker import Worker

Worker.title_interval = 0.3
