"""A locustfile with forkserve's plugin whose users keep slow requests in flight,
so that stopping the server (TERM, graceful) takes a while."""

from locust import FastHttpUser, constant, task

import forkserve.integrations.locust  # noqa: F401  (the plugin)


class Slow(FastHttpUser):
    wait_time = constant(0)

    @task
    def slow(self):
        self.client.get("/slow?20")
