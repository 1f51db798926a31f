"""A real Slurm for the tests: one node in this host's network, or two "hosts" in network
namespaces joined by a shaped veth (tests/test_slurm.py).

Everything lives under one folder: slurm.conf, a munge key and socket, the daemons' state, logs
and pid files. The daemons run in the foreground (`-D`, `-F`) as children of the test process,
so they are stopped by their process ids; every process they start (slurmstepd, the job's
script, launcher and ranks) carries ``MPIRL_SLURM_CLUSTER=<folder>`` in its environment, which
is how `SlurmCluster.stop` finds and ends what the jobs left (by pid, never by name).

Needs root and the Debian packages ``slurmctld slurmd slurm-client munge`` (Slurm 22.05 in
bookworm); `ensure_packages` installs them with apt-get where missing. `unavailable` says why a
cluster cannot come up here (the tests skip with that reason).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("slurmctld", "slurmd", "sbatch", "munged")
TAG = "MPIRL_SLURM_CLUSTER"


def ensure_packages(timeout: float = 600) -> str | None:
    """Install Slurm and munge with apt-get where a binary is missing. None when ready, else
    why not (not root, no apt-get, the install failed)."""
    if all(shutil.which(b, path="/usr/sbin:/usr/bin:/sbin:/bin") for b in BINARIES):
        return None
    if os.geteuid() != 0:
        return "a real Slurm needs root (daemons started as root) and Slurm is not installed"
    if not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install it"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES],
    ):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"{' '.join(cmd)} took more than {timeout:.0f} s (no package access?)"
        if p.returncode != 0:
            return f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-500:]}"
    missing = [b for b in BINARIES if not shutil.which(b, path="/usr/sbin:/usr/bin")]
    return f"installed {PACKAGES} but {missing} are still missing" if missing else None


def unavailable() -> str | None:
    """Why a one-node Slurm cannot come up here, or None."""
    if os.geteuid() != 0:
        return "a real Slurm needs root (munged, slurmctld and slurmd run as root here)"
    return ensure_packages()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str  # the Slurm node name, and the host name slurmd sees (its own UTS namespace)
    addr: str  # NodeAddr
    netns: str | None = None  # run slurmd (and, on the first node, slurmctld) in this namespace
    cpus: int = 16  # CPUs=16 with config_overrides: 9 ranks fit on 2 real cores


@dataclass
class SlurmCluster:
    root: Path
    nodes: list[Node]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def ctl(self) -> Node:
        return self.nodes[0]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for clients (sbatch, squeue, ...) and so for the jobs (--export=ALL)."""
        e = dict(os.environ, SLURM_CONF=str(self.conf), **{TAG: str(self.root)})
        e["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin:" + e.get("PATH", "")
        e.update(extra)
        return e

    # ---- start and stop ---------------------------------------------------------------------

    def write_config(self) -> None:
        r = self.root
        r.mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)
        (r / "ctld").mkdir(exist_ok=True)
        for n in self.nodes:
            (r / f"slurmd-{n.name}").mkdir(exist_ok=True)
        key = r / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        port_ctld, port_d = free_port(), free_port()
        # the controller's short host name must be this host's (or its UTS namespace's)
        ctl_host = self.ctl.name if self.ctl.netns else socket.gethostname().split(".")[0]
        lines = [
            f"ClusterName=mpirl{secrets.token_hex(3)}",
            f"SlurmctldHost={ctl_host}({self.ctl.addr})",
            f"SlurmctldPort={port_ctld}",
            f"SlurmdPort={port_d}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire (default 120 s) also delays a requeued job's start that long
            f"AuthInfo=socket={r}/munge.socket,cred_expire=10",
            f"StateSaveLocation={r}/ctld",
            f"SlurmdSpoolDir={r}/slurmd-%n",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/slurmctld.log",
            f"SlurmdLogFile={r}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SlurmdParameters=config_overrides",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "KillWait=30",
            "MinJobAge=3600",
            "InactiveLimit=0",
            # the controller looks at time limits and --signal times every few seconds
            "SchedulerParameters=defer_batch=0",
            "MessageTimeout=30",
        ]
        for n in self.nodes:
            host = n.name if n.netns else socket.gethostname().split(".")[0]
            lines.append(
                f"NodeName={n.name} NodeHostname={host} NodeAddr={n.addr} CPUs={n.cpus} "
                "RealMemory=200000 State=UNKNOWN"
            )
        names = ",".join(n.name for n in self.nodes)
        lines.append(f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, cmd: list[str], node: Node | None = None) -> None:
        if node is not None and node.netns:
            # nsenter, not `ip netns exec`: that remounts /sys, hiding /sys/fs/cgroup, without
            # which slurmd 22.05 does not start. A mount namespace of its own instead puts the
            # namespace's hosts file over /etc/hosts; a UTS namespace gives it its host name.
            hosts = Path(f"/etc/netns/{node.netns}/hosts")
            script = (
                (f"mount --bind {hosts} /etc/hosts && " if hosts.exists() else "")
                + f"hostname {node.name} && exec "
                + " ".join(cmd)
            )
            cmd = [
                "nsenter",
                f"--net=/run/netns/{node.netns}",
                "unshare",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
            ]
        log = open(self.root / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True
        )

    def start(self, timeout: float = 60) -> None:
        self.write_config()
        r = self.root
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "--force",
                f"--socket={r}/munge.socket",
                f"--key-file={r}/munge.key",
                f"--pid-file={r}/munged.pid",
                f"--log-file={r}/munged.log",
                f"--seed-file={r}/munged.seed",
            ],
        )
        self._wait(lambda: (r / "munge.socket").exists(), 10, "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)], self.ctl)
        for n in self.nodes:
            self._spawn(f"slurmd-{n.name}", ["slurmd", "-D", "-f", str(self.conf), "-N", n.name], n)
        self._wait(self.nodes_idle, timeout, "every node idle (sinfo)")

    def nodes_idle(self) -> bool:
        p = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
        return len(states) == len(self.nodes) and all(s.startswith("idle") for s in states.values())

    def _wait(self, ok, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            dead = [k for k, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead} exited while waiting for {what}:\n{self.logs()}")
            time.sleep(0.5)
        raise TimeoutError(f"no {what} after {timeout:.0f} s:\n{self.logs()}")

    def logs(self, tail: int = 3000) -> str:
        out = []
        for f in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    def tagged_pids(self) -> list[int]:
        """Processes whose environment carries this cluster's tag (slurmstepd, job processes),
        not counting the daemons we started ourselves."""
        mine = f"{TAG}={self.root}".encode()
        ours = {p.pid for p in self.procs.values()} | {os.getpid()}
        ctld = self.procs.get("slurmctld")
        out = []
        for d in Path("/proc").glob("[0-9]*"):
            try:
                if int(d.name) in ours:
                    continue
                stat = (d / "stat").read_text()
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
                if ctld is not None and ppid == ctld.pid and ctld.poll() is None:
                    continue  # slurmscriptd, the controller's helper: ends with it
                if mine in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except (OSError, ValueError):
                continue
        return out

    def stop(self) -> None:
        """Cancel every job, stop the daemons by pid, then end any process a job left."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--quiet", "-u", "root"], check=False, timeout=20)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.tagged_pids():
                time.sleep(0.5)
        for name in [k for k in self.procs if k.startswith("slurmd")] + ["slurmctld", "munged"]:
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.tagged_pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if pids:
                time.sleep(2)

    # ---- clients ----------------------------------------------------------------------------

    def run(
        self, cmd: list[str], check: bool = True, timeout: float = 60, **kw
    ) -> subprocess.CompletedProcess:
        """A client command, in the controller's namespace when it has one."""
        env = self.env(**kw.pop("env", {}))
        if self.ctl.netns:
            cmd = ["ip", "netns", "exec", self.ctl.netns, *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise RuntimeError(f"{cmd} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def sbatch(self, *args: str, cwd: str | Path, env: dict | None = None) -> int:
        p = self.run(["sbatch", "--parsable", *args], cwd=cwd, env=env or {})
        return int(p.stdout.strip().split(";")[0].split("_")[0])

    def job(self, job_id: int | str) -> dict[str, str]:
        """`scontrol show job` as key -> value (the first record: an array's first task)."""
        p = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        rec = p.stdout.splitlines()[0] if p.stdout.strip() else ""
        out = {}
        for item in rec.split():
            k, _, v = item.partition("=")
            out[k] = v
        return out

    def jobs(self, job_id: int | str) -> list[dict[str, str]]:
        """Every record of a job (an array's tasks, a hetjob's components)."""
        p = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        out = []
        for rec in p.stdout.splitlines():
            d = {}
            for item in rec.split():
                k, _, v = item.partition("=")
                d[k] = v
            out.append(d)
        return out

    def wait_done(self, job_id: int | str, timeout: float) -> list[dict[str, str]]:
        """Until every record of the job has ended; returns them."""
        deadline = time.monotonic() + timeout
        ended = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
        while time.monotonic() < deadline:
            recs = self.jobs(job_id)
            if recs and all(r.get("JobState") in ended for r in recs):
                return recs
            time.sleep(1)
        raise TimeoutError(f"job {job_id} not done after {timeout:.0f} s: {self.jobs(job_id)}")


# ---- two "hosts": network namespaces joined by a shaped veth ---------------------------------


@dataclass
class ShapedLink:
    """Two network namespaces, ``cloud`` and ``edge``, joined by a veth pair whose both ends
    are shaped with tbf (``rate``); /etc/netns/<ns>/hosts names both ends, so the host names
    resolve inside them (``ip netns exec`` bind-mounts that file over /etc/hosts).

    Only the namespaces' own addresses are used (10.213.0.1, .2 inside them); `remove` deletes
    the namespaces (and with them the veth) and the hosts files."""

    tag: str  # unique per test run: other users' namespaces are never touched
    rate: str = "100mbit"
    addrs: tuple[str, str] = ("10.213.0.1", "10.213.0.2")
    names: tuple[str, str] = ("cloud", "edge")

    @property
    def netns(self) -> tuple[str, str]:
        return (f"mpirl-{self.tag}-cloud", f"mpirl-{self.tag}-edge")

    @property
    def devs(self) -> tuple[str, str]:
        return (f"mc{self.tag}"[:15], f"me{self.tag}"[:15])

    def create(self) -> None:
        (nc, ne), (dc, de) = self.netns, self.devs
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{a} {n}\n" for a, n in zip(self.addrs, self.names, strict=True)
        )
        for ns in (nc, ne):
            _ip("netns", "add", ns)
            Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{ns}/hosts").write_text(hosts)
        _ip("link", "add", dc, "type", "veth", "peer", "name", de)
        for ns, dev, addr in ((nc, dc, self.addrs[0]), (ne, de, self.addrs[1])):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")
            _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                  "burst", "64kb", "latency", "100ms"])  # fmt: skip

    def counters(self) -> dict[str, int]:
        """The cloud end's byte counters (``ip -s link``): rx edge -> cloud, tx cloud -> edge."""
        import json as _json

        p = _run(["ip", "-n", self.netns[0], "-s", "-j", "link", "show", "dev", self.devs[0]])
        st = _json.loads(p.stdout)[0]["stats64"]
        return {"rx_bytes": st["rx"]["bytes"], "tx_bytes": st["tx"]["bytes"]}

    def qdisc(self) -> str:
        return _run(["tc", "-n", self.netns[0], "qdisc", "show", "dev", self.devs[0]]).stdout

    def remove(self) -> None:
        for ns in self.netns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {p.returncode}: {p.stderr.strip()}")
    return p


def _ip(*args: str) -> subprocess.CompletedProcess:
    return _run(["ip", *args])


def two_hosts_unavailable() -> str | None:
    """Why two namespaced hosts cannot come up here, or None."""
    why = unavailable()
    if why:
        return why
    if not (shutil.which("ip") and shutil.which("tc")) and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "iproute2"],
            capture_output=True,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
            timeout=300,
        )
    for tool in ("ip", "tc", "nsenter", "unshare"):
        if not shutil.which(tool):
            return f"{tool} is missing (iproute2, util-linux)"
    probe = f"mpirl-probe-{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return f"cannot create a network namespace: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None
