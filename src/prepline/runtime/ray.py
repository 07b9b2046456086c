"""Ray runtime: an actor pool with dynamic per-task dispatch.

Joins the cluster at ``address`` (``auto``, ``ray://...`` or a head's GCS address; inside a Ray
job ``ray.init()`` finds it), or starts a local Ray bound to 127.0.0.1 when none is given.
Actors live for the whole run (all phases); each caches one Worker per phase spec. An actor that
dies (OOM kill, node lost) is replaced and its task runs again on the new one.
"""

from __future__ import annotations

import logging
import os

from prepline.context import WorkerSpec
from prepline.errors import ConfigError
from prepline.runtime.dispatch import OnResult, WorkerLost, dispatch
from prepline.worker import Worker

log = logging.getLogger("prepline")


class RayExecutor:
    def __init__(self, workers: int = 0, cpus_per_worker: float = 1.0, address: str | None = None, task_retries: int = 2):
        try:
            import ray
        except ImportError:
            raise ConfigError("the ray runtime needs Ray", "pip install 'prepline[ray]' or use --runtime local") from None
        self._ray = ray
        self._started = False
        self.cpus_per_worker = cpus_per_worker
        self.task_retries = task_retries
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

    def run(self, spec: WorkerSpec, tasks: list, on_result: OnResult) -> bool:
        n = min(self.workers, len(tasks))
        while len(self._actors) < n:
            self._actors.append(self._actor())
        return dispatch(_Actors(self, spec, n), tasks, on_result, self.task_retries)

    def close(self) -> None:
        for a in self._actors:
            self._ray.kill(a)
        self._actors = []
        if self._started:
            self._ray.shutdown()


class _Actors:
    """The dispatch backend over the executor's first ``n`` actors: one task per free actor."""

    lost_fix = "check the Ray logs; give workers more memory (--cpus-per-worker) or use fewer workers"

    def __init__(self, ex: RayExecutor, spec: WorkerSpec, n: int):
        self.ex, self.ray = ex, ex._ray
        self.capacity = n
        self._spec_ref = self.ray.put(spec)
        self._free = list(ex._actors[:n])
        self._busy: dict = {}  # object ref -> actor

    def submit(self, task):
        actor = self._free.pop()
        ref = actor.run.remote(self._spec_ref, task)
        self._busy[ref] = actor
        return ref

    def wait(self, handles: list) -> list:
        return self.ray.wait(handles, num_returns=1)[0]

    def result(self, ref) -> dict:
        actor = self._busy.pop(ref)
        try:
            r = self.ray.get(ref)
        except Exception as e:  # the actor died (OOM kill, node loss): replace it
            self.ex._actors.remove(actor)
            self.ray.kill(actor)
            actor = self.ex._actor()
            self.ex._actors.append(actor)
            self._free.append(actor)
            raise WorkerLost(f"Ray worker failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}") from None
        self._free.append(actor)
        return r

    def cancel(self, handles: list) -> None:
        # force=True is refused for actor tasks (ValueError), and close() kills the actors anyway
        for ref in handles:
            try:
                self.ray.cancel(ref)
            except Exception:  # noqa: BLE001 - best effort
                pass


class _RayWorker:
    def __init__(self):
        self._spec: WorkerSpec | None = None
        self._w: Worker | None = None

    def run(self, spec: WorkerSpec, task) -> dict:
        if spec != self._spec:
            self._spec, self._w = spec, Worker(spec)
        return self._w.run(task)
