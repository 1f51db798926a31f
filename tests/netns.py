"""A real long-haul link on one machine, for tests and bench/real_link.py (docs/running.md,
"A real shaped link").

Two network namespaces, ``edge`` and ``cloud`` (names made unique with the pid), joined by a veth
pair; each end's egress is shaped with ``tc qdisc ... tbf`` (rate, burst, queue latency), so both
directions of the link run at the set rate.  Addresses 10.77.0.1 (edge) and 10.77.0.2 (cloud)
live only inside those namespaces.  Host names: ``ip netns exec NS`` bind-mounts
``/etc/netns/NS/hosts`` over ``/etc/hosts``, so each namespace resolves ``mpirl-edge`` and
``mpirl-cloud`` to the veth addresses and nothing outside changes; each rank also gets its own
UTS namespace named after its host (``unshare --uts``), so ``gethostname`` (mpirl's host table,
MPI's processor name) says which side it runs on.

MPICH's Hydra (the mpich wheel's mpirun) runs in ``cloud`` and starts its proxies through a
launcher script (``-launcher ssh -launcher-exec SCRIPT``) that enters the namespace of the host
it is given: a hostfile puts the learner (rank 0) on ``mpirl-cloud`` and the other ranks on
``mpirl-edge``, so MPI takes no shared memory between them; ``UCX_TLS=tcp,self`` (and
``FI_PROVIDER=tcp`` should MPICH pick its OFI netmod) keeps UCX from its own shared-memory
transports, which would work across network namespaces on one machine.  Ranks on one host
still share memory (MPICH's own).  The interface counters (`RealLink.counters`) show the bytes
cross the veth.

`unavailable()` gives the reason these cannot run here (not root, no ``ip``/``tc``/``unshare``,
namespaces or tbf refused), for a skip.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from mpirl.launch import mpirun_path

EDGE_IP, CLOUD_IP = "10.77.0.1", "10.77.0.2"
HOSTS = {"edge": "mpirl-edge", "cloud": "mpirl-cloud"}
#: bytes of headers per packet on the veth: Ethernet 14 + IPv4 20 + TCP 20 + timestamps 12
HEADER_BYTES = 66
_SERIAL = itertools.count()
_OURS = re.compile(r"^mpirl-(?:edge|cloud)-(\d+)-\d+$")


def remove_stale() -> None:
    """Remove the namespaces (and their /etc/netns folders) a killed session left behind: ours
    are named after the creating process, which no longer exists."""
    out = _run("ip", "netns", "list", check=False).stdout
    for name in (line.split()[0] for line in out.splitlines() if line.strip()):
        m = _OURS.match(name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            _run("ip", "netns", "del", name, check=False)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str:
    """Why a shaped namespace link cannot be made here ('' when it can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2, util-linux)"
    if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode != 0:
        return "`unshare --uts` is refused here (needs CAP_SYS_ADMIN)"
    from mpirl.launch import launcher

    if launcher() != "mpich":
        return "the namespace launcher is written for MPICH's Hydra (the mpich wheel)"
    try:
        with RealLink(rate_mbps=1.0):
            pass
    except (subprocess.CalledProcessError, OSError) as e:
        err = getattr(e, "stderr", "") or str(e)
        return f"cannot create a shaped namespace link here: {err.strip()[:200]}"
    return ""


class RealLink:
    """``with RealLink(rate_mbps=1.0) as link:`` two shaped namespaces, removed on exit."""

    def __init__(
        self,
        rate_mbps: float,
        burst_bytes: int = 1600,
        queue_ms: float = 400.0,
        tag: str | None = None,
    ):
        tag = tag or f"{os.getpid()}-{next(_SERIAL)}"
        self.rate_mbps, self.burst, self.queue_ms = rate_mbps, burst_bytes, queue_ms
        self.ns = {"edge": f"mpirl-edge-{tag}", "cloud": f"mpirl-cloud-{tag}"}
        # interface names: at most 15 characters
        self.dev = {"edge": f"mre{tag}"[:15], "cloud": f"mrc{tag}"[:15]}
        self.dir: Path | None = None
        self.made: list[str] = []

    # ---- set up, tear down ---------------------------------------------------------------------
    def __enter__(self) -> RealLink:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        remove_stale()
        e, c = self.ns["edge"], self.ns["cloud"]
        de, dc = self.dev["edge"], self.dev["cloud"]
        for ns in (e, c):
            _run("ip", "netns", "add", ns)
            self.made.append(ns)
        _run("ip", "link", "add", de, "type", "veth", "peer", "name", dc)
        _run("ip", "link", "set", de, "netns", e)
        _run("ip", "link", "set", dc, "netns", c)
        for side, ip in (("edge", EDGE_IP), ("cloud", CLOUD_IP)):
            ns, dev = self.ns[side], self.dev[side]
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            # one MSS per packet (no GSO: tbf would take a 64 kB super-packet apart on enqueue
            # and drop what its queue cannot hold), so the shaper delays and never drops: no
            # byte crosses twice and no ACK carries SACK blocks (`HEADER_BYTES` per packet)
            _run("ip", "-n", ns, "link", "set", "dev", dev, "gso_max_segs", "1")
            _run("ip", "-n", ns, "link", "set", "dev", dev, "gso_max_size", "1514")
            # and TCP keeps at most 12 kB per socket in the qdisc (TCP small queues), under
            # tbf's queue (`queue_ms` of the rate) for the few sockets MPI and Hydra open
            _run(
                "ip", "netns", "exec", ns,
                "sysctl", "-qw", "net.ipv4.tcp_limit_output_bytes=12000",
            )  # fmt: skip
            _run(
                "tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                "rate", f"{int(self.rate_mbps * 1e6)}bit",
                "burst", str(self.burst),
                "latency", f"{self.queue_ms:g}ms",
            )  # fmt: skip
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(
                f"127.0.0.1 localhost\n{EDGE_IP} {HOSTS['edge']}\n{CLOUD_IP} {HOSTS['cloud']}\n"
            )
        self.dir = Path(tempfile.mkdtemp(prefix="mpirl-netns-"))
        script = self.dir / "enter.sh"
        # Hydra calls `SCRIPT [ssh options] HOST COMMAND...`: the host picks the namespace
        script.write_text(
            "#!/bin/sh\n"
            'while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done\n'
            'host=$1; shift\ncase "$host" in\n'
            f"  {HOSTS['edge']}) ns={e};;\n  {HOSTS['cloud']}) ns={c};;\n"
            '  *) echo "enter.sh: unknown host $host" >&2; exit 1;;\nesac\n'
            'exec ip netns exec "$ns" unshare --uts sh -c "hostname $host; $*"\n'
        )
        script.chmod(0o755)
        self.script = script

    def close(self) -> None:
        for ns in self.made:
            _run("ip", "netns", "del", ns, check=False)  # takes the veth pair with it
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        self.made = []
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    # ---- use -------------------------------------------------------------------------------------
    def set_rate(self, rate_mbps: float) -> None:
        """Reshape both ends to ``rate_mbps`` (tc qdisc change)."""
        for side in ("edge", "cloud"):
            _run(
                "tc", "-n", self.ns[side], "qdisc", "change", "dev", self.dev[side], "root",
                "tbf", "rate", f"{int(rate_mbps * 1e6)}bit", "burst", str(self.burst),
                "latency", f"{self.queue_ms:g}ms",
            )  # fmt: skip
        self.rate_mbps = rate_mbps

    def enter(self, side: str) -> list[str]:
        """The command prefix that runs a program on ``side`` ('edge' or 'cloud')."""
        return ["ip", "netns", "exec", self.ns[side]]

    def mpirun_cmd(self, n: int, cloud: int = 1) -> list[str]:
        """``mpirun ... -n N`` with ranks 0..cloud-1 on mpirl-cloud, the rest on mpirl-edge;
        run from the cloud namespace."""
        hostfile = self.dir / f"hosts-{n}-{cloud}"
        hostfile.write_text(f"{HOSTS['cloud']}:{cloud}\n{HOSTS['edge']}:{n - cloud}\n")
        return [
            *self.enter("cloud"),
            # mpirun's host (Hydra starts the cloud ranks itself, not through the script)
            *("unshare", "--uts", "sh", "-c", f'hostname {HOSTS["cloud"]}; exec "$0" "$@"'),
            mpirun_path(),
            "-launcher", "ssh", "-launcher-exec", str(self.script),
            "-f", str(hostfile),
            "-genv", "UCX_TLS", "tcp,self",
            "-genv", "FI_PROVIDER", "tcp",
            "-n", str(n),
        ]  # fmt: skip

    def drops(self) -> int:
        """Packets the shapers dropped (both ends), since the link was made."""
        n = 0
        for side in ("edge", "cloud"):
            out = _run(
                "tc", "-n", self.ns[side], "-s", "-j", "qdisc", "show", "dev", self.dev[side]
            )
            n += sum(q.get("drops", 0) for q in json.loads(out.stdout))
        return n

    def counters(self) -> dict[str, int]:
        """The edge end's interface counters: ``tx_bytes``/``tx_packets`` toward the cloud,
        ``rx_bytes``/``rx_packets`` from it (Ethernet frames, headers included)."""
        out = _run("ip", "-n", self.ns["edge"], "-s", "-j", "link", "show", "dev", self.dev["edge"])
        s = json.loads(out.stdout)[0]["stats64"]
        return {
            "tx_bytes": s["tx"]["bytes"],
            "tx_packets": s["tx"]["packets"],
            "rx_bytes": s["rx"]["bytes"],
            "rx_packets": s["rx"]["packets"],
        }

    def tcp_rate(self, seconds: float = 2.0, nbytes: int | None = None) -> float:
        """Bits per second a plain TCP stream gets from edge to cloud (the receiver's count over
        the time from its first to its last byte)."""
        port = 5201
        code = (
            "import socket,time\n"
            "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            f"s.bind(('{CLOUD_IP}',{port}));s.listen(1);c,_=s.accept()\n"
            "n=0;t0=None\n"
            "while True:\n"
            "    b=c.recv(65536)\n"
            "    if not b: break\n"
            "    t0=t0 or time.monotonic();n+=len(b);t1=time.monotonic()\n"
            "print(n,t1-t0)\n"
        )
        server = subprocess.Popen(
            [*self.enter("cloud"), sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
        )
        total = nbytes or int(self.rate_mbps * 1e6 / 8 * seconds)
        client = (
            "import socket,time\n"
            "for _ in range(100):\n"
            "    try:\n"
            f"        s=socket.create_connection(('{CLOUD_IP}',{port}));break\n"
            "    except OSError: time.sleep(0.05)\n"
            f"s.sendall(bytes({total}));s.close()\n"
        )
        subprocess.run([*self.enter("edge"), sys.executable, "-c", client], check=True, timeout=120)
        out, _ = server.communicate(timeout=60)
        n, dt = out.split()
        return int(n) * 8 / float(dt)


def hostname_of(side: str) -> str:
    return HOSTS[side]


if __name__ == "__main__":  # python tests/netns.py: check the rig by hand
    why = unavailable()
    if why:
        sys.exit(f"netns: {why}")
    with RealLink(rate_mbps=float(sys.argv[1]) if len(sys.argv) > 1 else 1.0) as link:
        before = link.counters()
        bps = link.tcp_rate(2.0)
        after = link.counters()
        print(f"TCP {bps / 1e6:.3f} Mb/s at {link.rate_mbps} Mb/s; counters {before} -> {after}")
        print(socket.gethostname(), link.ns)
