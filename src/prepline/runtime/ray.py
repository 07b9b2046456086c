"""Ray runtime: an actor pool with dynamic per-task dispatch.

Joins the cluster at ``address`` (``auto``, ``ray://...`` or a head's GCS address; inside a Ray
job ``ray.init()`` finds it), or starts a local Ray bound to 127.0.0.1 when none is given.
Actors live for the whole run (all phases); each caches one Worker per phase spec. An actor that
dies (OOM kill, node lost) is replaced and its task runs again on the new one.
"""

from __future__ import annotations

import logging
import os
import threading

from prepline import logs
from prepline.context import WorkerSpec
from prepline.errors import ConfigError, RunFailed
from prepline.progress import SEND_INTERVAL, Report
from prepline.runtime import allocator
from prepline.runtime.dispatch import Liveness, OnResult, WorkerLost, dispatch
from prepline.worker import Worker

log = logging.getLogger("prepline")


class RayExecutor:
    def __init__(self, workers: int = 0, cpus_per_worker: float = 1.0, address: str | None = None, task_retries: int = 2,
                 task_timeout: float = 0.0, gpus_per_worker: float = 0.0):
        try:
            import ray
        except ImportError:
            raise ConfigError("the ray runtime needs Ray", "pip install 'prepline[ray]' or use --runtime local") from None
        self._ray = ray
        self._started = False
        self.cpus_per_worker = cpus_per_worker
        #: GPUs each actor reserves: Ray places it on a node with that many free (and sets CUDA_VISIBLE_DEVICES)
        self.gpus_per_worker = gpus_per_worker
        self.task_retries = task_retries
        self.task_timeout = task_timeout
        self.stats: dict = {"retried": 0, "stalled": 0}
        if not ray.is_initialized():
            if address is None and not os.environ.get("RAY_ADDRESS"):
                # a private local Ray: every listener on loopback, modest object store
                os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
                with allocator.not_inherited():  # Ray's own processes keep the system allocator
                    ray.init(
                        address="local",  # a new one: never another user's Ray that happens to run on this machine
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
        res = ray.cluster_resources()
        if gpus_per_worker:
            if res.get("GPU", 0) < gpus_per_worker:  # an autoscaler may add a GPU node once an actor asks for one
                log.warning("the Ray cluster has %g GPU(s) now and each worker reserves %g: waiting up to %ss "
                            "(PREPLINE_RAY_WORKER_WAIT) for a node with GPUs", res.get("GPU", 0), gpus_per_worker,
                            os.environ.get("PREPLINE_RAY_WORKER_WAIT", "300"))
            self.workers = workers or max(int(res.get("GPU", 0) // gpus_per_worker), 1)
        else:
            self.workers = workers or max(int(res.get("CPU", 1) // cpus_per_worker), 1)
        self._actor_cls = ray.remote(_RayWorker)
        self._actors: list = []  # started and answering
        self._starting: dict = {}  # ping ref -> actor not placed or not answering yet
        # running tasks' progress: actors send to a small actor, a driver thread collects every second
        self._box = ray.remote(num_cpus=0)(ProgressBox).remote()
        self._on_progress: Report | None = None
        self._stop = threading.Event()
        self._collector = threading.Thread(target=self._collect, name="prepline-progress-in", daemon=True)
        self._collector.start()

    def _actor(self):
        return self._actor_cls.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker).remote(
            self._box, os.environ.get(logs.ENV_FORMAT, ""))

    def _collect(self) -> None:
        while not self._stop.wait(SEND_INTERVAL):
            try:
                reports = self._ray.get(self._box.take.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - progress is best effort; the run goes on
                continue
            on = self._on_progress
            for key, (docs, nbytes, beat) in reports.items():
                if on is not None:
                    on(key, docs, nbytes, beat)

    def run(self, spec: WorkerSpec, tasks: list, on_result: OnResult, on_progress: Report | None = None) -> bool:
        from prepline.runtime.local import _reporter

        live = Liveness(self.task_timeout) if self.task_timeout > 0 else None
        self._on_progress = _reporter(on_progress, live)
        try:
            return dispatch(_Actors(self, spec, min(self.workers, len(tasks))), tasks, on_result, self.task_retries, self.stats, live)
        finally:
            self._on_progress = None

    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._collector.join(timeout=15)
        alive = self._actors + list(self._starting.values())
        try:  # warnings a worker held back (counted repeats): said before it goes
            self._ray.get([a.flush_logs.remote() for a in self._actors], timeout=5)
        except Exception:  # noqa: BLE001 - best effort
            pass
        for a in alive + [self._box]:
            self._ray.kill(a)
        self._actors, self._starting = [], {}
        if self._started:
            self._ray.shutdown()


class _Actors:
    """The dispatch backend over up to ``n`` actors: one task per free actor.

    An actor counts (``capacity``) once it answered a ping: a new one may wait for a free CPU. An
    actor that died (OOM kill, node lost) is dropped, its task runs again on another, and a
    replacement is asked for; it joins when Ray can place it. With no actor left, the run waits
    at most ``PREPLINE_RAY_WORKER_WAIT`` seconds for one (an autoscaler adding a node), then fails.
    """

    lost_fix = "check the Ray logs (a node lost, a worker killed for memory); give workers more memory or use fewer; rerun to resume"

    def __init__(self, ex: RayExecutor, spec: WorkerSpec, n: int):
        self.ex, self.ray = ex, ex._ray
        self._spec_ref = self.ray.put(spec)
        self._free = list(ex._actors[:n])
        self.capacity = len(self._free)
        self._busy: dict = {}  # object ref -> actor
        while self.capacity + len(ex._starting) < n:
            self._start_one()

    def _start_one(self) -> None:
        actor = self.ex._actor()
        self.ex._starting[actor.ping.remote()] = actor

    def _arrived(self, ping) -> None:
        actor = self.ex._starting.pop(ping)
        try:
            self.ray.get(ping)
        except Exception as e:  # noqa: BLE001 - it died while starting (its node went away)
            log.warning("a Ray worker died while starting: %s", str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__)
            self.ray.kill(actor)
            return
        self.ex._actors.append(actor)
        self._free.append(actor)
        self.capacity += 1

    def submit(self, task):
        actor = self._free.pop()
        ref = actor.run.remote(self._spec_ref, task)
        self._busy[ref] = actor
        return ref

    def wait(self, handles: list, timeout: float | None = None) -> list:
        done = self.ray.wait(handles + list(self.ex._starting), num_returns=1, timeout=timeout)[0]
        out = []
        for ref in done:
            if ref in self.ex._starting:
                self._arrived(ref)
            else:
                out.append(ref)
        return out

    def result(self, ref) -> dict:
        actor = self._busy.pop(ref)
        try:
            r = self.ray.get(ref)
        except Exception as e:  # the actor died (OOM kill, node loss): drop it, ask for another
            self.ex._actors.remove(actor)
            self.ray.kill(actor)
            self.capacity -= 1
            self._start_one()
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            raise WorkerLost(f"Ray worker lost: {type(e).__name__}: {first}") from None
        self._free.append(actor)
        return r

    def stop(self, ref, pid: int | None) -> None:
        """A task that made no progress: its actor is killed and replaced (the task runs again elsewhere)."""
        actor = self._busy.pop(ref)
        if actor in self.ex._actors:
            self.ex._actors.remove(actor)
        self.ray.kill(actor)
        self.capacity -= 1
        self._start_one()

    def wait_for_worker(self) -> None:
        wait = float(os.environ.get("PREPLINE_RAY_WORKER_WAIT", "300"))
        if self.ex._starting:
            done = self.ray.wait(list(self.ex._starting), num_returns=1, timeout=wait)[0]
            if done:
                self._arrived(done[0])
                return
        raise RunFailed(
            f"every Ray worker was lost and none could be started again within {wait:.0f}s "
            f"(cluster CPUs now: {self.ray.cluster_resources().get('CPU', 0):g}, {self.ex.cpus_per_worker:g} per worker"
            + (f"; GPUs now: {self.ray.cluster_resources().get('GPU', 0):g}, {self.ex.gpus_per_worker:g} per worker)"
               if self.ex.gpus_per_worker else ")"),
            "bring the cluster's nodes back (or add some), then rerun the same command: it resumes; "
            "PREPLINE_RAY_WORKER_WAIT sets how long to wait for a worker",
        )

    def cancel(self, handles: list) -> None:
        # force=True is refused for actor tasks (ValueError), and close() kills the actors anyway
        for ref in handles:
            try:
                self.ray.cancel(ref)
            except Exception:  # noqa: BLE001 - best effort
                pass


class ProgressBox:
    """An actor holding the latest progress of each running task until the driver takes it."""

    def __init__(self):
        self._latest: dict = {}

    def add(self, key: str, docs: int, nbytes: int, beat: tuple | None = None) -> None:
        old = self._latest.get(key)
        self._latest[key] = (docs, nbytes, beat if beat is not None else (old[2] if old else None))

    def take(self) -> dict:
        out, self._latest = self._latest, {}
        return out


class _RayWorker:
    def __init__(self, box=None, log_format: str = ""):
        if log_format:
            os.environ.setdefault(logs.ENV_FORMAT, log_format)
        logs.setup_worker()
        from prepline import worker

        worker.THREAD_CPU_ONLY = True  # Ray's own threads here use CPU whatever the task does
        self._spec: WorkerSpec | None = None
        self._w: Worker | None = None
        self._box = box

    def _send(self, key: str, docs: int, nbytes: int, beat: tuple | None = None) -> None:
        self._box.add.remote(key, docs, nbytes, beat)  # fire and forget

    def ping(self) -> int:
        return os.getpid()

    def flush_logs(self) -> None:
        logs.flush_repeats()

    def run(self, spec: WorkerSpec, task) -> dict:
        if spec != self._spec:
            self._spec, self._w = spec, Worker(spec, self._send if self._box is not None else None)
        return self._w.run(task)
