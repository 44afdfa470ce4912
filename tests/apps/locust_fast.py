"""A locustfile with forkserve's plugin whose users send quick requests back to
back, so that a server stopping while they still send would fail some."""

from locust import FastHttpUser, constant, task

import forkserve.integrations.locust  # noqa: F401  (the plugin)


class Fast(FastHttpUser):
    wait_time = constant(0)

    @task
    def pid(self):
        self.client.get("/pid")
