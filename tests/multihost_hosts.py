"""The hosts of the multi-host bed: Linux namespaces on one machine (see ``tests.multihost``).

Each host is one long-lived init process started with ``unshare --net --mount --uts``:
- its own network namespace, with one address on a bridge the bed makes in a private /24 that
  nothing on the machine uses (checked first). No default route: a host reaches the bed's own
  addresses and nothing else, and that is checked before any process of the bed starts;
- its own mount namespace: the machine's disk read-only (the venv, the Horovod build, /usr and
  the repository, as an image would be; a test that writes there fails as on a real host),
  private tmpfs on /tmp, /var/tmp and /dev/shm, its own /sys (its own network devices), and the
  bed's /etc/hosts (hostA.. → their addresses) and an empty resolv.conf bound over the machine's;
- its own hostname.
Every later process of a host joins the init's namespaces with ``nsenter`` and starts from a
clean environment carrying the bed's marker; teardown (``tests.multihost_down``) kills every
process that carries it or lives in a bed namespace, and checks that nothing is left.
"""

from __future__ import annotations

import ipaddress
import json
import os
import selectors
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .helpers import SUITE_VARIABLE
from .multihost_net import check_isolated, connect, free_subnet, make_bridge

BED_DIR = Path("/run/hvd_magic-bed")  # on the machine's disk: read-only inside the hosts
STATE = BED_DIR / "state.json"
MARKER = "HVD_MAGIC_BED"  # in the environment of every process of the bed
NAMESPACES = ("net", "mnt", "uts")
HOST_PATH = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
INIT_SECONDS = 20.0
STOP_SECONDS = 10.0

INIT_SCRIPT = """set -e
mount --bind {dir}/hosts /etc/hosts
mount --bind {dir}/resolv.conf /etc/resolv.conf
mount -o remount,bind,ro /etc/hosts
mount -o remount,bind,ro /etc/resolv.conf
mount -o remount,bind,ro /
mount -t sysfs -o ro sysfs /sys
{hold}for dir in /tmp /var/tmp /dev/shm; do mount -t tmpfs -o mode=1777,size=4g tmpfs "$dir"; done
{keep}mkdir -p /tmp/home /tmp/work
hostname {name}
ip link set lo up
echo ready
exec sleep infinity
"""


@dataclass
class Host:
    name: str
    ip: str
    pid: int  # its init process: every process of the host joins this one's namespaces
    namespaces: dict[str, str] = field(default_factory=dict)  # "net" -> "net:[4026532…]"


@dataclass
class Bed:
    """The running hosts; ``spawn``/``run`` start processes inside one of them."""

    id: str
    subnet: str
    hosts: list[Host]
    children: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def command(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """``argv`` inside host ``name``: its namespaces, a clean environment, cwd /tmp/work."""
        host = self.host(name)
        clean = {
            "PATH": HOST_PATH,
            "HOME": "/tmp/home",
            "LANG": "C.UTF-8",
            MARKER: self.id,
            **{k: v for k, v in os.environ.items() if k == SUITE_VARIABLE},  # the suite's mark (helpers)
            **(env or {}),
        }
        enter = ["nsenter", "-t", str(host.pid), *(f"--{kind}" for kind in ("mount", "uts", "net"))]
        return [*enter, "--", "env", "-i", "-C", "/tmp/work", *(f"{k}={v}" for k, v in clean.items()), *argv]

    def spawn(
        self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A long-running process in host ``name``, its output in ``log`` (on the machine)."""
        with open(log, "ab") as out:
            process = subprocess.Popen(
                self.command(name, argv, env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.children.append(process)
        return process

    def run(self, name: str, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(name, argv), capture_output=True, text=True, timeout=timeout, check=False
        )

    def seen_from(self, name: str, path: str) -> str:
        """``path`` as host ``name`` sees it (its own /tmp), from the machine: through its init
        process's root, which is looked up in that host's mount namespace. Checking a file there
        costs no process, where ``run`` costs an nsenter, a shell and the command. Raises where
        the host's /tmp cannot be read so (a check that reads nothing would find nothing left)."""
        root = f"/proc/{self.host(name).pid}/root"
        os.listdir(f"{root}/tmp")  # OSError if that view is not there
        return f"{root}{path}"

    def save(self) -> None:
        state = {"id": self.id, "subnet": self.subnet, "hosts": [asdict(h) for h in self.hosts]}
        STATE.write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls) -> Bed | None:
        """The bed described in the state file (``alive()`` says whether it still runs)."""
        try:
            state = json.loads(STATE.read_text())
        except (OSError, ValueError):
            return None
        return cls(state["id"], state["subnet"], [Host(**h) for h in state["hosts"]])

    def alive(self) -> bool:
        return all(namespaces_of(h.pid) == h.namespaces for h in self.hosts)


def unusable_reason() -> str | None:
    """Why the bed cannot run here (not root, a tool missing, namespaces refused), or None."""
    if os.geteuid() != 0:
        return "the multi-host bed needs root (network and mount namespaces, a bridge)"
    missing = [tool for tool in ("ip", "unshare", "nsenter", "java", "mpirun") if shutil.which(tool) is None]
    if missing:
        return f"the multi-host bed needs {', '.join(missing)} (not found on PATH)"
    probe = (
        "mount -t tmpfs tmpfs /tmp && hostname probe && ip link add probe0 type veth peer name probe1"
        " && ip link add probe2 type bridge && ip link set probe0 master probe2"
    )
    unshare = ["unshare", "--net", "--mount", "--uts", "--propagation", "private", "--", "sh", "-c", probe]
    tried = subprocess.run(unshare, capture_output=True, text=True, check=False)
    if tried.returncode != 0:
        return f"namespaces, veth pairs or bridges are refused here: {tried.stderr.strip()[:300]}"
    return None


def namespaces_of(pid: int) -> dict[str, str]:
    try:
        return {kind: os.readlink(f"/proc/{pid}/ns/{kind}") for kind in NAMESPACES}
    except OSError:
        return {}


def _write_files(subnet: ipaddress.IPv4Network, names: list[str]) -> list[tuple[str, str]]:
    """The bed's /etc/hosts and resolv.conf; the hosts' (name, address) pairs."""
    BED_DIR.mkdir(mode=0o755, exist_ok=True)
    hosts = [(name, str(subnet.network_address + 11 + index)) for index, name in enumerate(names)]
    lines = ["127.0.0.1 localhost", *(f"{ip} {name}" for name, ip in hosts)]
    (BED_DIR / "hosts").write_text("\n".join(lines) + "\n")
    (BED_DIR / "resolv.conf").write_text("# the multi-host bed: no name server (names are in /etc/hosts)\n")
    return hosts


def _read_until_ready(init: subprocess.Popen[bytes]) -> str:
    """``ready``, or what the init said before it failed or went quiet for INIT_SECONDS."""
    assert init.stdout is not None
    said: list[str] = []
    with selectors.DefaultSelector() as selector:
        selector.register(init.stdout, selectors.EVENT_READ)
        while selector.select(INIT_SECONDS) and (line := init.stdout.readline()):
            if line == b"ready\n":
                init.stdout.close()
                return "ready"
            said.append(line.decode(errors="replace").strip())
    return " / ".join(said) or f"nothing within {INIT_SECONDS:.0f} s"


def _kept_paths(name: str) -> tuple[str, str]:
    """Mounts that bring the checkout and its venv back, read-only, when they live under a folder
    the hosts get a private tmpfs on (a clone in /tmp, as CI may make): the image, as on a real
    host. Each is held on a folder of the bed's before the tmpfs covers it, then moved back."""
    private = ("/tmp/", "/var/tmp/", "/dev/shm/")
    paths = {str(Path(__file__).resolve().parents[1]), sys.prefix}
    kept = [p for p in sorted(paths) if p.startswith(private)]
    kept = [p for p in kept if not any(p.startswith(f"{other}/") for other in kept)]  # the outermost
    hold, keep = [], []
    for index, path in enumerate(kept):
        holder = BED_DIR / "keep" / name / str(index)
        holder.mkdir(parents=True, exist_ok=True)
        hold.append(f"mount -n --bind {path} {holder}")  # -n: the disk is read-only by now
        keep += [f"mkdir -p {path}", f"mount -n --move {holder} {path}"]
        keep.append(f"mount -n -o remount,bind,ro {path}")
    return "".join(f"{line}\n" for line in hold), "".join(f"{line}\n" for line in keep)


def _start_init(name: str, bed_id: str) -> subprocess.Popen[bytes]:
    """The host's init process, once its mounts, hostname and loopback are set up."""
    hold, keep = _kept_paths(name)
    script = INIT_SCRIPT.format(dir=BED_DIR, name=name, hold=hold, keep=keep)
    init = subprocess.Popen(
        ["unshare", "--net", "--mount", "--uts", "--propagation", "private", "--", "sh", "-c", script],
        env={"PATH": HOST_PATH, MARKER: bed_id},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    said = _read_until_ready(init)
    if said != "ready":
        init.kill()
        init.wait()
        raise RuntimeError(f"host {name} did not set itself up: {said}")
    return init


def up_hosts(names: list[str]) -> Bed:
    """The hosts (in parallel), connected through the bridge, checked isolated."""
    subnet = free_subnet()
    pairs = _write_files(subnet, names)
    bed_id = uuid.uuid4().hex[:12]
    make_bridge(subnet)
    with ThreadPoolExecutor(len(names)) as pool:
        inits = list(pool.map(lambda name: _start_init(name, bed_id), names))
    hosts = [
        Host(name, ip, init.pid, namespaces_of(init.pid))
        for (name, ip), init in zip(pairs, inits, strict=True)
    ]
    bed = Bed(bed_id, str(subnet), hosts, inits)
    bed.save()  # from here on, `down` finds the hosts even if the rest fails
    for host in bed.hosts:
        connect(host.name, host.pid, host.ip, subnet)
    for host in bed.hosts:
        check_isolated(host.name, host.pid, host.ip, subnet)
    return bed
