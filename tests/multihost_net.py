"""The multi-host bed's network: a bridge on a private /24 that nothing on the machine uses, one
veth pair per host, and the check that no host can send anywhere but to the bed's addresses."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

BRIDGE = "hvdbed0"
LINK_PREFIX = "hvdbed-"  # the machine's end of a host's veth pair: hvdbed-hostA


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the machine has an address or a route in (the default route aside)."""
    found = []
    lines = sh("ip", "-o", "-4", "addr", "show").splitlines()
    lines += sh("ip", "-4", "route", "show", "table", "all").splitlines()
    for line in lines:
        for token in line.split():
            try:
                found.append(ipaddress.IPv4Network(token, strict=False))
                break
            except ValueError:  # "dev", "local", an interface name ...: not the network yet
                continue
    return found


def free_subnet(prefix: str = "10.213") -> ipaddress.IPv4Network:
    """The first ``prefix``.x.0/24 that no address or route of the machine overlaps (the bed's
    prefix is its own: a test that makes a bridge beside it takes another)."""
    used = used_networks()
    for third in range(256):
        candidate = ipaddress.IPv4Network(f"{prefix}.{third}.0/24")
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    raise RuntimeError(f"no free {prefix}.x.0/24 on this machine: every one overlaps an address or route")


def _no_ipv6(link: str, pid: int | None = None) -> None:
    """No IPv6 on the bed's links: no link-local chatter, no second way out to reason about."""
    setting = f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6"
    if pid is None:
        Path(setting).write_text("1")
    else:  # /proc/sys/net is the namespace of the process that writes it
        sh("nsenter", "-t", str(pid), "--net", "--", "sh", "-c", f"echo 1 > {setting}")


def make_bridge(subnet: ipaddress.IPv4Network, name: str = BRIDGE) -> str:
    """The bridge, with the subnet's first address (the bed's: the machine's side, by which tests
    reach the hosts)."""
    sh("ip", "link", "add", name, "type", "bridge")
    _no_ipv6(name)
    address = str(subnet.network_address + 1)
    sh("ip", "addr", "add", f"{address}/{subnet.prefixlen}", "dev", name)
    sh("ip", "link", "set", name, "up")
    return address


def connect(name: str, pid: int, ip: str, subnet: ipaddress.IPv4Network) -> None:
    """A host's veth pair: eth0 in its namespace with its address, the other end on the bridge."""
    outside = f"{LINK_PREFIX}{name}"
    sh("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", str(pid))
    _no_ipv6(outside)
    _no_ipv6("eth0", pid)
    sh("ip", "link", "set", outside, "master", BRIDGE, "up")
    inside = f"ip addr add {ip}/{subnet.prefixlen} dev eth0 && ip link set eth0 up"
    sh("nsenter", "-t", str(pid), "--net", "--", "sh", "-c", inside)


def _route_targets(pid: int, family: str) -> set[str]:
    routes = sh("nsenter", "-t", str(pid), "--net", "--", "ip", family, "route", "show", "table", "all")
    return {
        words[1] if words[0] in ("local", "broadcast", "multicast", "anycast") else words[0]
        for words in (line.split() for line in routes.splitlines())
    }


def check_isolated(name: str, pid: int, ip: str, subnet: ipaddress.IPv4Network) -> None:
    """Before anything runs: the host routes to the bed's /24 and its own loopback only (no
    default route), so nothing it sends can leave the machine or reach an address the bed
    did not make."""
    allowed = {str(subnet), ip, str(subnet.broadcast_address), "127.0.0.0/8", "127.0.0.1", "127.255.255.255"}
    allowed |= {"::1", "ff00::/8"}  # IPv6: loopback only (disabled on eth0)
    targets = _route_targets(pid, "-4") | _route_targets(pid, "-6")
    if not targets <= allowed:
        raise RuntimeError(f"host {name} has routes beyond the bed: {sorted(targets - allowed)}")


def links() -> list[str]:
    """The bed's links still on the machine."""
    names = [line.split(":")[1].strip().split("@")[0] for line in sh("ip", "-o", "link").splitlines()]
    return [name for name in names if name == BRIDGE or name.startswith(LINK_PREFIX)]


def remove_links() -> None:
    """The hosts' veth pairs (already gone with their namespaces, usually), then the bridge."""
    for name in sorted(links(), key=lambda name: name == BRIDGE):
        subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
