"""Ray runtime: an actor pool with dynamic per-task dispatch.

Joins the cluster at ``address`` (``auto``, ``ray://...`` or a head's GCS address; inside a Ray
job ``ray.init()`` finds it), or starts a local Ray bound to 127.0.0.1 when none is given.
"""

from __future__ import annotations

import logging
import os

from prepline.engine import Worker, WorkerSpec
from prepline.errors import ConfigError

log = logging.getLogger("prepline")


class RayExecutor:
    def __init__(self, workers: int = 0, cpus_per_worker: float = 1.0, address: str | None = None):
        try:
            import ray
        except ImportError:
            raise ConfigError("the ray runtime needs Ray", "pip install 'prepline[ray]' or use --runtime local") from None
        self._ray = ray
        self._started = False
        self.cpus_per_worker = cpus_per_worker
        if not ray.is_initialized():
            if address is None and not os.environ.get("RAY_ADDRESS"):
                # a private local Ray: every listener on loopback, modest object store
                os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
                ray.init(
                    num_cpus=max(int(workers * cpus_per_worker + 0.999), 1) if workers else None,
                    include_dashboard=False,
                    object_store_memory=512 * 1024 * 1024,
                    _node_ip_address="127.0.0.1",
                    log_to_driver=True,
                    configure_logging=False,
                )
            else:
                ray.init(address=address, log_to_driver=True)
            self._started = True
        cpus = ray.cluster_resources().get("CPU", 1)
        self.workers = workers or max(int(cpus // cpus_per_worker), 1)
        self._actor_cls = ray.remote(_RayWorker)

    def run(self, spec: WorkerSpec, tasks: list, on_result) -> bool:
        ray = self._ray
        n = min(self.workers, len(tasks))
        actors = [self._actor_cls.options(num_cpus=self.cpus_per_worker).remote(spec) for _ in range(n)]
        queue = list(reversed(tasks))
        running: dict = {}
        try:
            for a in actors:
                if queue:
                    t = queue.pop()
                    running[a.run.remote(t)] = (a, t)
            while running:
                done, _ = ray.wait(list(running), num_returns=1)
                for ref in done:
                    actor, t = running.pop(ref)
                    try:
                        r = ray.get(ref)
                    except Exception as e:  # the actor died (OOM kill, node loss)
                        r = {"error": f"{getattr(t, 'path', t)}: Ray worker failed: {type(e).__name__}: {str(e)[:300]}",
                             "fix": "check the Ray logs; give workers more memory (--cpus-per-worker) or fewer workers"}
                        actor = self._actor_cls.options(num_cpus=self.cpus_per_worker).remote(spec)
                        actors.append(actor)
                    if not on_result(t, r):
                        return False
                    if queue:
                        nt = queue.pop()
                        running[actor.run.remote(nt)] = (actor, nt)
            return True
        finally:
            for a in actors:
                ray.kill(a)

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()


class _RayWorker:
    def __init__(self, spec: WorkerSpec):
        self._w = Worker(spec)

    def run(self, task) -> dict:
        return self._w.run(task)
