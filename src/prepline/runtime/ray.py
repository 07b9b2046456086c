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
        self._actors: list = []

    def _actor(self):
        return self._actor_cls.options(num_cpus=self.cpus_per_worker).remote()

    def run(self, spec: WorkerSpec, tasks: list, on_result) -> bool:
        """Actors live for the whole run (all phases); each caches one Worker per phase spec."""
        ray = self._ray
        n = min(self.workers, len(tasks))
        while len(self._actors) < n:
            self._actors.append(self._actor())
        spec_ref = ray.put(spec)
        queue = list(reversed(tasks))
        running: dict = {}
        for a in self._actors[:n]:
            if queue:
                t = queue.pop()
                running[a.run.remote(spec_ref, t)] = (a, t)
        while running:
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                actor, t = running.pop(ref)
                try:
                    r = ray.get(ref)
                except Exception as e:  # the actor died (OOM kill, node loss): replace it
                    r = {"error": f"{getattr(t, 'path', t)}: Ray worker failed: {type(e).__name__}: {str(e)[:300]}",
                         "fix": "check the Ray logs; give workers more memory (--cpus-per-worker) or use fewer workers"}
                    self._actors.remove(actor)
                    ray.kill(actor)
                    actor = self._actor()
                    self._actors.append(actor)
                if not on_result(t, r):
                    # stop the tasks still in flight; force=True is refused for actor tasks (ValueError),
                    # and close() kills the actors anyway
                    for ref2 in running:
                        try:
                            ray.cancel(ref2)
                        except Exception:  # noqa: BLE001 - best effort: the actors are killed next
                            pass
                    return False
                if queue:
                    nt = queue.pop()
                    running[actor.run.remote(spec_ref, nt)] = (actor, nt)
        return True

    def close(self) -> None:
        for a in self._actors:
            self._ray.kill(a)
        self._actors = []
        if self._started:
            self._ray.shutdown()


class _RayWorker:
    def __init__(self):
        self._spec: WorkerSpec | None = None
        self._w: Worker | None = None

    def run(self, spec: WorkerSpec, task) -> dict:
        if spec != self._spec:
            self._spec, self._w = spec, Worker(spec)
        return self._w.run(task)
