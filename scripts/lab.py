#!/usr/bin/env python3
"""A lab of real hosts on one machine: network namespaces on a bridge (docs/lab.md).

Each host is a network namespace ``pl-<name>-<host>`` with its own loopback, an address on one bridge
(RFC 2544 test range 198.18.0.0/15), its own ``/etc/hosts`` (``/etc/netns/<ns>/hosts``, which
``ip netns exec`` binds over /etc/hosts) and, for every process it runs, a private mount namespace
in which ``/tmp`` is the host's own scratch directory and ``/dev/shm`` a private tmpfs. A state file
records every object before it is made, so ``down`` removes everything even after a crash.

CLI:   scripts/lab.py [--name N] [--subnet CIDR] up [--ray] [--s3] | down | status | exec HOST -- CMD...
Python (importable with scripts/ on sys.path): ``from lab import Lab`` (docs/lab.md).
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATE_DIR = Path("/run/prepline-lab")
SCRATCH_ROOT = Path("/tmp")  # under the real /tmp: binding a host's own dir over /tmp hides the rest
DEFAULT_HOSTS = ("launcher", "ray-0", "ray-1", "ray-2", "s3", "trainer-0", "trainer-1")
S3_PORT = 9000
RAY_PORT = 6379
DASHBOARD_PORT = 8265
NAME_RE = re.compile(r"^[a-z0-9]{1,8}$")
HOST_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
#: cgroup v1's memory controller, else cgroup v2's unified hierarchy (a host's memory limit: Lab.limit_memory)
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")


def hidden_by_private_tmp() -> str | None:
    """Why the lab's processes could not see this checkout or its Python (each host's /tmp is its
    own scratch folder, so anything under the real /tmp is invisible inside), or None."""
    for what, path in (("the Python", Path(sys.executable)), ("this checkout", Path(__file__).resolve().parent.parent)):
        p = path.absolute()
        if p == SCRATCH_ROOT or SCRATCH_ROOT in p.parents:
            return (f"{what} is under {SCRATCH_ROOT} ({p}), which every lab host replaces with its own scratch folder: "
                    f"the hosts would not find it; clone the project (and make its .venv) outside {SCRATCH_ROOT}")
    return None


class LabError(RuntimeError):
    pass


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def _remove_cgroup(cg: Path, timeout: float = 30) -> None:
    """rmdir a cgroup whose processes were killed (the kernel may take a moment to let them go)."""
    deadline = time.time() + timeout
    while cg.is_dir():
        try:
            cg.rmdir()
        except OSError as e:
            if time.time() > deadline:
                raise LabError(f"cgroup {cg} cannot be removed ({e}): processes {(cg / 'cgroup.procs').read_text().split()} are left") from None
            time.sleep(0.2)


def default_subnet(name: str) -> str:
    """A /24 of 198.18.0.0/15 derived from the lab name (distinct labs rarely collide; pass one to be sure)."""
    n = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 512
    return f"198.{18 + n // 256}.{n % 256}.0/24"


def free_subnet(name: str) -> str:
    """default_subnet(name), or the next /24 of the test range that no route of this machine uses
    (so that labs made at once by different processes do not overlap)."""
    r = _sh("ip", "-4", "route", "show", check=False)
    used = set()
    for line in r.stdout.splitlines():
        try:
            used.add(ipaddress.ip_network(line.split()[0], strict=False))
        except ValueError:
            continue
    first = ipaddress.ip_network(default_subnet(name))
    base = int(ipaddress.ip_address("198.18.0.0"))
    start = (int(first.network_address) - base) // 256
    for k in range(512):
        net = ipaddress.ip_network(f"{ipaddress.ip_address(base + ((start + k) % 512) * 256)}/24")
        if not any(net.overlaps(u) for u in used):
            return str(net)
    raise LabError("no free /24 left in 198.18.0.0/15")


def can_make_namespaces() -> str | None:
    """None when this process may make network namespaces; else the reason it may not."""
    if os.geteuid() != 0:
        return "not root (the lab makes network namespaces)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "the ip or unshare command is missing"
    probe = f"pl-probe-{os.getpid()}"
    r = _sh("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot make a network namespace: {r.stderr.strip()}"
    _sh("ip", "netns", "del", probe, check=False)
    return None


def http_get(url: str, timeout: float = 30):
    """GET a lab address from this machine, never through a proxy of the caller's environment."""
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=timeout)


def project_env() -> dict[str, str]:
    """The environment every lab process starts from: the project venv and nothing of the caller's
    credentials (a pod gets only what its spec gives it)."""
    venv_bin = ROOT / ".venv" / "bin"
    env = {
        "PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
    }
    if (ROOT / ".wt").is_dir():  # a worktree: the shared venv's editable install points elsewhere
        env["PYTHONPATH"] = f"{ROOT / '.wt'}:{ROOT / 'src'}"
    return env


def faketime_env(offset_s: int) -> dict[str, str]:
    """The env that sets a process's (and its children's) wall clock ``offset_s`` seconds from the
    real one: Debian's libfaketime (scripts/setup.sh installs it), preloaded. The monotonic clocks
    move by the same offset (only their differences mean anything, so nothing sees it): left real,
    libfaketime turns the absolute monotonic deadline of Python's ``time.sleep`` (clock_nanosleep,
    TIMER_ABSTIME) into an invalid one and every sleep fails with EINVAL (``ray start`` did)."""
    import glob

    libs = sorted(glob.glob("/usr/lib/*-linux-gnu/faketime/libfaketimeMT.so.1"))
    if not libs:
        raise LabError("libfaketime is not installed, so a lab host's clock cannot be set apart: run apt-get install -y libfaketime")
    return {"LD_PRELOAD": libs[0], "FAKETIME": f"{offset_s:+d}", "FAKETIME_NO_CACHE": "1"}


class Lab:
    """A named lab of hosts. ``Lab(name, subnet)`` loads the state file when one exists."""

    def __init__(self, name: str = "lab", subnet: str | None = None):
        if not NAME_RE.match(name):
            raise LabError(f"lab name {name!r}: 1-8 characters a-z0-9 (interface names are at most 15)")
        self.name = name
        self.state_path = STATE_DIR / f"{name}.json"
        self.state: dict = {}
        if self.state_path.exists():
            self.state = json.loads(self.state_path.read_text())
            if subnet and subnet != self.state.get("subnet"):
                raise LabError(f"lab {name} exists with subnet {self.state.get('subnet')}; run down first")
        self.subnet = ipaddress.ip_network(subnet or self.state.get("subnet") or free_subnet(name))
        if not self.subnet.subnet_of(ipaddress.ip_network("198.18.0.0/15")):
            raise LabError(f"subnet {self.subnet} is not inside the test range 198.18.0.0/15")
        self.bridge = f"plbr{name}"
        self.scratch_root = SCRATCH_ROOT / f"pl-lab-{name}"

    # ---- state ---------------------------------------------------------------------------------
    def _save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.state_path)

    def _intend(self, kind: str, value) -> None:
        """Record an object before making it (down removes what may exist)."""
        lst = self.state.setdefault(kind, [])
        if value not in lst:
            lst.append(value)
            self._save()

    @property
    def hosts(self) -> list[str]:
        return list(self.state.get("ips", {}))

    def ns(self, host: str) -> str:
        return f"pl-{self.name}-{host}"

    def ip(self, host: str) -> str:
        try:
            return self.state["ips"][host]
        except KeyError:
            raise LabError(f"lab {self.name} has no host {host!r} (hosts: {', '.join(self.hosts)})") from None

    def shared_dir(self, what: str) -> Path:
        """A directory every host of the lab sees at the same path (outside /tmp, which each host has
        its own of), removed by ``down``: e.g. files that configure the hosts' processes."""
        d = STATE_DIR / f"{self.name}-{what}"
        self._intend("dirs", str(d))
        d.mkdir(parents=True, exist_ok=True)
        return d

    @property
    def gateway(self) -> str:
        """The bridge's own address (this machine, as the lab's hosts reach it): e.g. where a control
        plane that runs in the caller listens."""
        return str(next(self.subnet.hosts()))

    def scratch(self, host: str) -> Path:
        """The host's private directory as seen from outside the lab (inside the host it is /tmp)."""
        return self.scratch_root / host

    # ---- up / down -----------------------------------------------------------------------------
    def up(self, hosts=DEFAULT_HOSTS) -> "Lab":
        hosts = list(hosts)
        for h in hosts:
            if not HOST_RE.match(h):
                raise LabError(f"host name {h!r}: a-z0-9 and '-'")
        why = can_make_namespaces() or hidden_by_private_tmp()
        if why:
            raise LabError(why)
        t0 = time.time()
        self.state.setdefault("name", self.name)
        self.state["subnet"] = str(self.subnet)
        self.state.setdefault("ips", {})
        self.state.setdefault("extra_hosts", {})
        self._save()
        addrs = list(self.subnet.hosts())
        gw = str(addrs[0])
        self._intend("dirs", str(self.scratch_root))
        self.scratch_root.mkdir(mode=0o755, exist_ok=True)
        self._intend("links", self.bridge)
        if _sh("ip", "link", "show", self.bridge, check=False).returncode != 0:
            _sh("ip", "link", "add", self.bridge, "type", "bridge")
            _sh("ip", "addr", "add", f"{gw}/{self.subnet.prefixlen}", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        used = set(self.state["ips"].values()) | {gw}
        for h in hosts:
            if h in self.state["ips"] and _sh("ip", "netns", "pids", self.ns(h), check=False).returncode == 0:
                continue
            ip = self.state["ips"].get(h) or next(str(a) for a in addrs if str(a) not in used)
            used.add(ip)
            self.state["ips"][h] = ip
            idx = sorted(self.state["ips"]).index(h)
            self._add_host(h, ip, idx)
        self.write_hosts()
        self.state["up_seconds"] = round(time.time() - t0, 2)
        self._save()
        return self

    def _add_host(self, host: str, ip: str, idx: int) -> None:
        ns = self.ns(host)
        n = len(self.state.setdefault("ips", {}))
        veth = f"pl{self.name}v{list(self.state['ips']).index(host)}"
        peer = f"pl{self.name}p{list(self.state['ips']).index(host)}"
        self._intend("netns", ns)
        self._intend("links", veth)
        self._intend("dirs", f"/etc/netns/{ns}")
        self.state.setdefault("veth", {})[host] = veth
        self._save()
        Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{ns}/hosts").write_text("")
        d = self.scratch(host)
        d.mkdir(mode=0o1777, parents=True, exist_ok=True)
        os.chmod(d, 0o1777)
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "del", veth, check=False)
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        _sh("ip", "link", "set", peer, "netns", ns)
        _sh("ip", "link", "set", veth, "master", self.bridge)
        _sh("ip", "link", "set", veth, "up")
        x = ["ip", "netns", "exec", ns]
        _sh(*x, "ip", "link", "set", "lo", "up")
        _sh(*x, "ip", "link", "set", peer, "name", "eth0")
        _sh(*x, "ip", "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0")
        _sh(*x, "ip", "link", "set", "eth0", "up")

    def write_hosts(self) -> None:
        """Rewrite every host's /etc/hosts in place (it is bind-mounted: never replace the file)."""
        lines = ["127.0.0.1 localhost"]
        for h, ip in self.state.get("ips", {}).items():
            lines.append(f"{ip} {h}")
        for alias, h in sorted(self.state.get("extra_hosts", {}).items()):
            lines.append(f"{self.ip(h)} {alias}")
        text = "\n".join(lines) + "\n"
        for h in self.hosts:
            p = Path(f"/etc/netns/{self.ns(h)}/hosts")
            if p.parent.is_dir():
                with open(p, "r+" if p.exists() else "w") as f:
                    f.seek(0)
                    f.write(text)
                    f.truncate()

    def add_alias(self, alias: str, host: str) -> None:
        """Make ``alias`` (e.g. ``c1-head-svc.team-a.svc.cluster.local``) resolve to ``host`` on every host."""
        self.ip(host)
        self.state.setdefault("extra_hosts", {})[alias] = host
        self._save()
        self.write_hosts()

    def remove_alias(self, alias: str) -> None:
        self.state.setdefault("extra_hosts", {}).pop(alias, None)
        self._save()
        self.write_hosts()

    def down(self) -> None:
        """Remove every process, namespace, link, /etc/netns entry and scratch dir the state file
        records. Idempotent; works after a crash."""
        for ns in self.state.get("netns", []):
            self._kill_ns(ns)
        for ns in self.state.get("netns", []):
            _sh("ip", "netns", "del", ns, check=False)
        for cg in self.state.get("cgroups", {}).values():
            _remove_cgroup(Path(cg))
        for link in self.state.get("links", []):
            if _sh("ip", "link", "show", link, check=False).returncode == 0:
                _sh("ip", "link", "del", link, check=False)
        for d in self.state.get("dirs", []):
            shutil.rmtree(d, ignore_errors=True)
        self.state_path.unlink(missing_ok=True)
        self.state = {}

    # ---- processes -----------------------------------------------------------------------------
    def pids(self, host: str) -> list[int]:
        return self._ns_pids(self.ns(host))

    @staticmethod
    def _ns_pids(ns: str) -> list[int]:
        r = _sh("ip", "netns", "pids", ns, check=False)
        return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []

    def _kill_ns(self, ns: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while True:
            pids = self._ns_pids(ns)
            if not pids:
                return
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.time() > deadline:
                raise LabError(f"processes {pids} in {ns} survive SIGKILL")
            time.sleep(0.1)

    def argv(self, host: str, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` on ``host`` (its netns, a private mount namespace with
        the host's scratch as /tmp and a private /dev/shm)."""
        ns = self.ns(host)
        if ns not in self.state.get("netns", []):
            raise LabError(f"lab {self.name} has no host {host!r}")
        setup = (
            f"mount --bind {self.scratch(host)} /tmp && "
            "mount -t tmpfs -o size=2g,mode=1777 tmpfs /dev/shm && exec \"$@\""
        )
        inner = ["ip", "netns", "exec", ns, "unshare", "-m", "--propagation", "private", "sh", "-c", setup, "sh", *argv]
        cg = self.state.get("cgroups", {}).get(host)
        # the host's memory cgroup is joined before `ip netns exec`, which mounts a /sys of the netns without the cgroup tree
        return ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *inner] if cg else inner

    def popen(self, host: str, argv: list[str], env: dict | None = None, cwd: str = "/tmp", **kw) -> subprocess.Popen:
        """Start ``argv`` on ``host``. The environment is project_env() plus ``env`` — nothing else of
        the caller's. ``cwd`` is a path inside the host (default its /tmp). Extra keywords go to Popen."""
        full = project_env()
        full.update(env or {})
        inner = ["sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv]
        return subprocess.Popen(self.argv(host, inner), env=full, **kw)

    def run(self, host: str, argv: list[str], env: dict | None = None, cwd: str = "/tmp", timeout: float = 600,
            check: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` to completion; returns a CompletedProcess with text stdout/stderr."""
        p = self.popen(host, argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise LabError(f"{argv} on {host}: no end within {timeout}s; stderr: {err[-2000:]}") from None
        r = subprocess.CompletedProcess(argv, p.returncode, out, err)
        if check and r.returncode != 0:
            raise LabError(f"{argv} on {host} exit {r.returncode}: {err[-3000:]}")
        return r

    def limit_memory(self, host: str, limit_bytes: int | None) -> Path:
        """A pod's memory limit for ``host``: every process it starts from now on (and their children)
        runs in its own memory cgroup, where the kernel OOM-kills the largest process when the host's
        memory (page cache included, reclaimed first) would pass ``limit_bytes``, as the kubelet's
        cgroup does to a container. ``None``: no limit (the cgroup still counts). Called again, it
        changes the limit of the processes already running. Returns the cgroup's directory."""
        self.ip(host)
        cg = self.state.setdefault("cgroups", {}).get(host)
        if cg is None:
            v2 = CGROUP_V2 / "cgroup.controllers"
            if CGROUP_V1_MEMORY.is_dir():
                cg = str(CGROUP_V1_MEMORY / self.ns(host))
            elif v2.exists() and "memory" in v2.read_text().split():
                if "memory" not in (CGROUP_V2 / "cgroup.subtree_control").read_text().split():
                    (CGROUP_V2 / "cgroup.subtree_control").write_text("+memory")
                cg = str(CGROUP_V2 / self.ns(host))
            else:
                raise LabError("no memory cgroup controller (neither /sys/fs/cgroup/memory nor cgroup v2's memory)")
            self.state["cgroups"][host] = cg  # recorded before it is made: down removes it
            self._save()
            Path(cg).mkdir(exist_ok=True)
        v1 = Path(cg, "memory.limit_in_bytes").exists()
        Path(cg, "memory.limit_in_bytes" if v1 else "memory.max").write_text(
            str(limit_bytes) if limit_bytes else ("-1" if v1 else "max"))
        return Path(cg)

    def memory(self, host: str, reset: bool = False) -> dict:
        """The host's memory cgroup: its limit, peak usage (page cache included), its processes' memory
        now (anonymous and shared memory: what cannot be reclaimed) and how many processes the kernel
        OOM-killed in it. ``reset``: start the peak again (cgroup v1)."""
        cg = Path(self.state.get("cgroups", {}).get(host) or self.limit_memory(host, None))
        if (cg / "memory.limit_in_bytes").exists():  # v1
            if reset:
                (cg / "memory.max_usage_in_bytes").write_text("0")
            oom = dict(line.split() for line in (cg / "memory.oom_control").read_text().splitlines())
            limit = int((cg / "memory.limit_in_bytes").read_text())
            stat = dict(line.split() for line in (cg / "memory.stat").read_text().splitlines())
            return {"limit_bytes": None if limit >= 2**62 else limit, "peak_bytes": int((cg / "memory.max_usage_in_bytes").read_text()),
                    "rss_bytes": int(stat["total_rss"]) + int(stat.get("total_shmem", 0)), "oom_kills": int(oom.get("oom_kill", 0))}
        events = dict(line.split() for line in (cg / "memory.events").read_text().splitlines())
        limit = (cg / "memory.max").read_text().strip()
        peak = cg / "memory.peak"
        stat = dict(line.split() for line in (cg / "memory.stat").read_text().splitlines())
        return {"limit_bytes": None if limit == "max" else int(limit), "peak_bytes": int(peak.read_text()) if peak.exists() else None,
                "rss_bytes": int(stat["anon"]) + int(stat.get("shmem", 0)), "oom_kills": int(events.get("oom_kill", 0))}

    def kill_host(self, host: str) -> None:
        """A host dies: its link goes down and every process in it is SIGKILLed."""
        self.cut(host)
        self._kill_ns(self.ns(host))

    def stop_host(self, host: str, grace: float = 15) -> None:
        """Every process of ``host`` is asked to stop (SIGTERM; a Ray node leaves the cluster cleanly)
        and, after ``grace`` seconds, SIGKILLed. (``ray stop`` is no way to do it: it finds Ray's
        processes by name in the one PID namespace all lab hosts share, so it stops every host's.)"""
        ns = self.ns(host)
        for p in self._ns_pids(ns):
            try:
                os.kill(p, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + grace
        while self._ns_pids(ns) and time.time() < deadline:
            time.sleep(0.2)
        self._kill_ns(ns)

    def cut(self, host: str) -> None:
        """Cut ``host`` off the network (its bridge port down); its processes keep running."""
        _sh("ip", "link", "set", self.state["veth"][host], "down")

    def restore(self, host: str) -> None:
        _sh("ip", "link", "set", self.state["veth"][host], "up")

    # ---- services ------------------------------------------------------------------------------
    def wait_port(self, host: str, port: int, timeout: float = 120) -> None:
        """Poll until ``host``:port accepts a TCP connection (from the root namespace, over the bridge)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                socket.create_connection((self.ip(host), port), timeout=2).close()
                return
            except OSError:
                time.sleep(0.2)
        raise LabError(f"{host}:{port} did not answer within {timeout}s")

    def start_s3(self, host: str = "s3", port: int = S3_PORT) -> str:
        """moto's S3 server on ``host``; returns its endpoint ``http://<ip>:<port>``."""
        log = open(self.scratch(host) / "moto.log", "ab")
        self.popen(host, ["moto_server", "-H", "0.0.0.0", "-p", str(port)], stdout=log, stderr=log)
        self.wait_port(host, port)
        endpoint = f"http://{self.ip(host)}:{port}"
        self.state["s3_endpoint"] = endpoint
        self._save()
        return endpoint

    @staticmethod
    def s3_env(endpoint: str) -> dict[str, str]:
        """The env a pod gets for the lab's S3 (moto takes any key)."""
        return {"PREPLINE_S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def start_ray(self, head: str = "ray-0", workers=("ray-1", "ray-2"), num_cpus: int = 1,
                  object_store_memory: int = 150 * 2**20, env: dict | None = None, timeout: float = 300,
                  head_cpus: int | None = None) -> str:
        """A real Ray cluster: ``ray start --head`` on ``head``, ``ray start --address`` on each worker
        host; waits (polling) until every node is alive. Returns the GCS address ``<head ip>:6379``;
        the dashboard/job API is ``http://<head ip>:8265``. ``head_cpus=0`` keeps tasks and actors off the
        head (KubeRay's usual head: ``num-cpus: "0"``)."""
        hip = self.ip(head)
        common = [f"--num-cpus={num_cpus}", f"--object-store-memory={object_store_memory}", "--disable-usage-stats"]
        head_args = [f"--num-cpus={head_cpus}", *common[1:]] if head_cpus is not None else common
        self.run(head, ["ray", "start", "--head", f"--node-ip-address={hip}", f"--port={RAY_PORT}",
                        "--dashboard-host=0.0.0.0", f"--dashboard-port={DASHBOARD_PORT}", "--include-dashboard=true",
                        *head_args], env=env, timeout=timeout, check=True)
        self.state["ray"] = {"head": head, "workers": [], "address": f"{hip}:{RAY_PORT}",
                             "dashboard": f"http://{hip}:{DASHBOARD_PORT}", "node_args": common}
        self._save()
        for w in workers:
            self.join_ray(w, env=env, timeout=timeout, wait=False)
        self.wait_ray_nodes(1 + len(workers), timeout=timeout)
        return f"{hip}:{RAY_PORT}"

    def join_ray(self, host: str, env: dict | None = None, timeout: float = 300, wait: bool = True,
                 clock_offset_s: int = 0) -> None:
        """``ray start --address`` on ``host`` into the lab's Ray cluster (the node arguments of
        start_ray). A host killed before comes back first: its link up, the dead node's files under
        its /tmp removed (a new machine in its place). With ``clock_offset_s``, every process of the
        node sees the wall clock that far from the other hosts' (libfaketime, as when a machine's
        NTP is off)."""
        ray = self.state["ray"]
        self.restore(host)
        shutil.rmtree(self.scratch(host) / "ray", ignore_errors=True)
        env = dict(env or {})
        if clock_offset_s:
            env.update(faketime_env(clock_offset_s))
        before = len([n for n in self.ray_nodes() if n.get("state") == "ALIVE"]) if wait else 0
        self.run(host, ["ray", "start", f"--address={ray['address']}", f"--node-ip-address={self.ip(host)}", *ray["node_args"]],
                 env=env, timeout=timeout, check=True)
        if host not in ray["workers"]:
            ray["workers"].append(host)
            self._save()
        if wait:
            self.wait_ray_nodes(before + 1, timeout=timeout)

    def ray_nodes(self) -> list[dict]:
        """The cluster's nodes from the head's own records (the dashboard's state API)."""
        url = self.state["ray"]["dashboard"] + "/api/v0/nodes?limit=100"
        with http_get(url, timeout=10) as r:
            data = json.loads(r.read())
        return data["data"]["result"]["result"]

    def wait_ray_nodes(self, n: int, timeout: float = 300) -> list[dict]:
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                alive = [x for x in self.ray_nodes() if x.get("state") == "ALIVE"]
                if len(alive) >= n:
                    return alive
                last = f"{len(alive)} alive"
            except Exception as e:  # dashboard not up yet
                last = repr(e)
            time.sleep(1)
        raise LabError(f"Ray cluster: {n} nodes not alive within {timeout}s ({last})")

    def status(self) -> dict:
        out = {"name": self.name, "subnet": str(self.subnet), "hosts": {}}
        for h, ip in self.state.get("ips", {}).items():
            out["hosts"][h] = {"ip": ip, "ns": self.ns(h), "processes": len(self.pids(h))}
        for k in ("s3_endpoint", "ray", "up_seconds"):
            if k in self.state:
                out[k] = self.state[k]
        return out


def run_pipeline(lab: Lab, a) -> int:
    """``run``: the pipeline on the lab (its hosts must be up: launcher, ray-0..2, s3)."""
    sys.path.insert(0, str(ROOT / "tests" / "lab"))
    import tempfile

    import lab_pipeline

    missing = {"launcher", "ray-0", "ray-1", "ray-2", "s3"} - set(lab.hosts)
    if missing:
        raise LabError(f"lab {lab.name} lacks the hosts {sorted(missing)}: run `scripts/lab.py --name {lab.name} up` first")
    with tempfile.TemporaryDirectory(prefix="lab-input-") as tmp:
        src = Path(a.input) if a.input else Path(tmp) / "sample"
        if not a.input:
            subprocess.run([str(ROOT / ".venv" / "bin" / "prepline"), "sample", "--docs", str(a.sample_docs), "--output", str(src)],
                           check=True, capture_output=True)
        tag = f"{Path(a.pipeline).stem.replace('_', '-')}-{int(time.time())}"
        trainers = a.trainer_hosts if a.trainer_hosts >= 0 else (2 if {"trainer-0", "trainer-1"} <= set(lab.hosts) else 0)
        missing = {f"trainer-{i}" for i in range(trainers)} - set(lab.hosts)
        if missing:
            raise LabError(f"--trainer-hosts {trainers}: the lab lacks {sorted(missing)}")
        out = lab_pipeline.run(lab, a.pipeline, src, tag, a.param, Path(a.compare).resolve() if a.compare else None,
                               trainer_hosts=trainers)
    out.pop("tail", None)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "stages"}, indent=1))
    bad = lab_pipeline.problems(out)
    for b in bad:
        print(f"problem: {b}", file=sys.stderr)
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/lab.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default="lab", help="lab name, 1-8 of a-z0-9 (several labs may coexist)")
    ap.add_argument("--subnet", default=None, help="a /24 inside 198.18.0.0/15 (default: derived from the name)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="make the hosts")
    u.add_argument("--hosts", default=",".join(DEFAULT_HOSTS))
    u.add_argument("--s3", action="store_true", help="start the S3 server on host s3")
    u.add_argument("--ray", action="store_true", help="start Ray: head on ray-0, workers on ray-1, ray-2")
    r = sub.add_parser("run", help="run a pipeline on the lab's hosts through its KubeRay control plane (tests/lab/lab_pipeline.py)")
    r.add_argument("pipeline", help="a pipeline name (e.g. super, exact_dedup) or a spec file")
    r.add_argument("--input", default=None, help="input folder on this machine (default: the bundled sample)")
    r.add_argument("--sample-docs", type=int, default=1000, help="size of the sample when --input is not given (default 1000)")
    r.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a pipeline parameter, as prepline pipeline run takes it")
    r.add_argument("--compare", default="", metavar="DIR", help="also run it locally with its work folder here and compare every stage's files")
    r.add_argument("--json", default="", help="write the outcome (clusters, hosts, tasks per host, comparison) here")
    r.add_argument("--trainer-hosts", type=int, default=-1,
                   help="the fine-tune as a TrainJob of this many nodes on hosts trainer-0.. (default: 2 when the lab has "
                        "trainer-0 and trainer-1, else 0: train_mode local, in the launcher)")
    sub.add_parser("down", help="remove everything the lab made")
    sub.add_parser("status", help="hosts, addresses, processes, services")
    e = sub.add_parser("exec", help="run a command on a host: exec HOST -- CMD ...")
    e.add_argument("host")
    e.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    try:
        lab = Lab(a.name, a.subnet)
        if a.cmd == "up":
            lab.up(a.hosts.split(","))
            if a.s3:
                lab.start_s3()
            if a.ray:
                lab.start_ray()
            print(json.dumps(lab.status(), indent=1))
        elif a.cmd == "run":
            return run_pipeline(lab, a)
        elif a.cmd == "down":
            lab.down()
        elif a.cmd == "status":
            print(json.dumps(lab.status(), indent=1))
        elif a.cmd == "exec":
            cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
            if not cmd:
                raise LabError("exec needs a command: exec HOST -- CMD ...")
            p = lab.popen(a.host, cmd, env={k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PREPLINE_"))})
            return p.wait()
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        print("fix: run as root on Linux; `scripts/lab.py --name NAME down` clears a half-made lab", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
