"""A small internet in network namespaces: the agent behind a 1:1 NAT with a firewall, callers
behind a masquerading NAT. Built with `ip netns`, veth pairs and nftables; always torn down.

    agent ns              agent-nat ns                          home-nat ns          home ns
    10.231.1.2 ── a0|a1 ─ 10.231.1.1   198.51.100.1 ── p0|p1 ── 198.51.100.20  ─ h1|h0 ── 10.231.2.2
                          (+198.51.100.10: the agent's            10.231.2.1
                           public address)

- agent-nat: 1:1 NAT 198.51.100.10 <-> 10.231.1.2 (DNAT in, SNAT out), and a forward filter
  that drops everything to the agent except TCP to its HTTP port and the UDP ports given
  (the `--rtc-ports` range or the `--rtc-udp-port` port), counting what it let through;
- home-nat: masquerades 10.231.2.0/24 behind 198.51.100.20; `switch_home_address()` moves
  it to another public address mid-call (a network change, as when a phone leaves Wi-Fi);
- neither router has a route to the other side's private network, so only the public
  addresses reach across. Every address is private (10.231/16) or documentation
  (198.51.100/24, RFC 5737); nothing is routed outside the namespaces.

`require_netns()` skips a test where namespaces cannot be made (not root, no `ip`/`nft`),
and fails it instead when `CI` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

AGENT_PRIVATE = "10.231.1.2"
AGENT_GATEWAY = "10.231.1.1"
AGENT_PUBLIC = "198.51.100.10"
AGENT_NAT_PUBLIC = "198.51.100.1"
HOME_NAT_PUBLIC = "198.51.100.20"
HOME_NAT_SWITCHED = "198.51.100.21"  # the home's public address after a network change
HOME_GATEWAY = "10.231.2.1"
HOME_PRIVATE = "10.231.2.2"
HOME_PRIVATE_SWITCHED = "10.231.2.3"  # the caller's own address after it changed network
HTTP_PORT = 8080
REPO = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT = 10.0
PRIORITY = -10  # niceness of the agent and the callers (root may raise it)


class NetnsUnavailable(Exception):
    pass


def _run(*args: str) -> str:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    if result.returncode != 0:
        raise NetnsUnavailable(f"{' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


def udp_ports_of(pid: int) -> set[int]:
    """The local ports of the UDP sockets process `pid` holds (IPv4 and IPv6, read from its
    own namespace's /proc tables)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports = set()
    for table in ("udp", "udp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def netns_problem() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for program in ("ip", "nft"):
        if shutil.which(program) is None:
            return f"{program} is not installed (scripts/install-test-deps.sh installs it)"
    probe = f"probe{uuid.uuid4().hex[:8]}"
    try:
        _run("ip", "netns", "add", probe)
    except (NetnsUnavailable, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace: {exc}"
    with contextlib.suppress(Exception):
        _run("ip", "netns", "del", probe)
    return None


def require_netns() -> None:
    """Skip where namespaces cannot be made, except under CI (then fail)."""
    problem = netns_problem()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"network namespace tests cannot run under CI: {problem}", pytrace=False)
    pytest.skip(problem)


@dataclass
class NatLab:
    """The four namespaces and what runs in them."""

    tag: str
    open_udp: str  # nft port set text: "40000-40023" or "40000"
    namespaces: list[str] = field(default_factory=list)
    processes: list[asyncio.subprocess.Process] = field(default_factory=list)
    log_reader: asyncio.Task[None] | None = None
    agent_udp_ports: set[int] = field(default_factory=set)
    home_private: str = HOME_PRIVATE  # the caller's address now (switch_home_network)
    home_public: str = HOME_NAT_PUBLIC  # its NAT's public address now (switch_home_address)

    @property
    def agent(self) -> str:
        return f"{self.tag}-agent"

    @property
    def agent_nat(self) -> str:
        return f"{self.tag}-anat"

    @property
    def home_nat(self) -> str:
        return f"{self.tag}-hnat"

    @property
    def home(self) -> str:
        return f"{self.tag}-home"

    @property
    def public_url(self) -> str:
        return f"http://{AGENT_PUBLIC}:{HTTP_PORT}"

    def ns(self, namespace: str, *args: str) -> str:
        return _run("ip", "netns", "exec", namespace, *args)

    def build(self) -> None:
        for namespace in (self.agent, self.agent_nat, self.home_nat, self.home):
            _run("ip", "netns", "add", namespace)
            self.namespaces.append(namespace)
            _run("ip", "-n", namespace, "link", "set", "lo", "up")
        links = ((self.agent, "a0", self.agent_nat, "a1"),
                 (self.agent_nat, "p0", self.home_nat, "p1"),
                 (self.home_nat, "h1", self.home, "h0"))
        for left, left_name, right, right_name in links:
            _run("ip", "link", "add", left_name, "netns", left, "type", "veth",
                 "peer", "name", right_name, "netns", right)
        addresses = ((self.agent, "a0", f"{AGENT_PRIVATE}/24"),
                     (self.agent_nat, "a1", f"{AGENT_GATEWAY}/24"),
                     (self.agent_nat, "p0", f"{AGENT_NAT_PUBLIC}/24"),
                     (self.agent_nat, "p0", f"{AGENT_PUBLIC}/32"),
                     (self.home_nat, "p1", f"{HOME_NAT_PUBLIC}/24"),
                     (self.home_nat, "h1", f"{HOME_GATEWAY}/24"),
                     (self.home, "h0", f"{HOME_PRIVATE}/24"))
        for namespace, device, address in addresses:
            _run("ip", "-n", namespace, "addr", "add", address, "dev", device)
        for namespace, device in ((self.agent, "a0"), (self.agent_nat, "a1"),
                                  (self.agent_nat, "p0"), (self.home_nat, "p1"),
                                  (self.home_nat, "h1"), (self.home, "h0")):
            _run("ip", "-n", namespace, "link", "set", device, "up")
        _run("ip", "-n", self.agent, "route", "add", "default", "via", AGENT_GATEWAY)
        _run("ip", "-n", self.home, "route", "add", "default", "via", HOME_GATEWAY)
        for router in (self.agent_nat, self.home_nat):
            self.ns(router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        self.nft(self.agent_nat, f"""
table ip lab {{
  counter udp_open {{
  }}
  counter dropped {{
  }}
  chain pre {{
    type nat hook prerouting priority dstnat; policy accept;
    ip daddr {AGENT_PUBLIC} dnat to {AGENT_PRIVATE}
  }}
  chain post {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {AGENT_PRIVATE} snat to {AGENT_PUBLIC}
  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname "a1" accept
    ip daddr {AGENT_PRIVATE} tcp dport {HTTP_PORT} accept
    ip daddr {AGENT_PRIVATE} udp dport {self.open_udp} counter name udp_open accept
    counter name dropped drop
  }}
}}
""")
        self.nft(self.home_nat, """
table ip lab {
  chain post {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "p1" masquerade
  }
}
""")

    def switch_home_address(self, address: str | None = None) -> None:
        """A network change: the home NAT's traffic leaves from `address` from now on (by
        default the other of 198.51.100.20 and .21). The address is added beside the old one,
        the masquerade replaced with `snat to address` and the router's connection tracking
        flushed (`conntrack -F`), so the flows already running (the call's UDP, kept-alive
        HTTP) get the new source at once; what the far side still sends to the old address
        finds no mapping there and is refused."""
        if address is None:
            address = HOME_NAT_SWITCHED if self.home_public == HOME_NAT_PUBLIC else HOME_NAT_PUBLIC
        if f" {address}/" not in self.ns(self.home_nat, "ip", "-o", "addr", "show", "dev", "p1"):
            _run("ip", "-n", self.home_nat, "addr", "add", f"{address}/24", "dev", "p1")
        self.nft(self.home_nat, f"""
flush chain ip lab post
add rule ip lab post oifname "p1" snat to {address}
""")
        self.ns(self.home_nat, "conntrack", "-F")
        self.home_public = address

    def switch_home_network(self, private: str | None = None,
                            public: str | None = None) -> None:
        """A network change the caller sees itself (Wi-Fi to cellular): its own address
        moves to `private` (by default the other of 10.231.2.2 and .3; the old one deleted, so
        its sockets there go dead) and its NAT's to `public` (`switch_home_address`)."""
        if private is None:
            private = HOME_PRIVATE_SWITCHED if self.home_private == HOME_PRIVATE else HOME_PRIVATE
        # Deleting an interface's first address deletes the others too unless promoted.
        self.ns(self.home, "sysctl", "-q", "-w", "net.ipv4.conf.h0.promote_secondaries=1")
        _run("ip", "-n", self.home, "addr", "add", f"{private}/24", "dev", "h0")
        _run("ip", "-n", self.home, "addr", "del", f"{self.home_private}/24", "dev", "h0")
        _run("ip", "-n", self.home, "route", "replace", "default", "via", HOME_GATEWAY)
        self.home_private = private
        self.switch_home_address(public)

    def nft(self, namespace: str, ruleset: str) -> None:
        result = subprocess.run(["ip", "netns", "exec", namespace, "nft", "-f", "-"],
                                input=ruleset, capture_output=True, text=True,
                                timeout=COMMAND_TIMEOUT)
        if result.returncode != 0:
            raise NetnsUnavailable(f"nft in {namespace}: {result.stderr.strip()}")

    def counter(self, name: str) -> int:
        """Packets the agent NAT's named counter has seen."""
        text = self.ns(self.agent_nat, "nft", "list", "counter", "ip", "lab", name)
        for word, value in zip(text.split(), text.split()[1:], strict=False):
            if word == "packets":
                return int(value)
        raise AssertionError(f"no packet count in {text!r}")

    async def start(self, namespace: str, *command: str,
                    stdout: int | None = asyncio.subprocess.DEVNULL,
                    ) -> asyncio.subprocess.Process:
        """A program inside `namespace` at raised priority (`ip netns exec` and `nice` exec it:
        the PID is the program's)."""
        # Raised priority: real-time audio for 20 calls on a small machine must not be
        # starved by whatever else runs there (the tests judge the audio, not the machine).
        process = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", namespace, "nice", "-n", str(PRIORITY), *command, cwd=REPO,
            stdout=stdout, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        self.processes.append(process)
        return process

    async def start_agent(self, *flags: str, ready: str = "serving plugin echo",
                          timeout: float = 60.0) -> list[str]:
        """The server in the agent namespace, once it logs `ready` (its log lines so far)."""
        server = await self.start(
            self.agent, sys.executable, "-m", "signaling", "--host", "0.0.0.0",
            "--port", str(HTTP_PORT), "--workers", "1", "--ice-host", AGENT_PRIVATE, *flags)
        lines: list[str] = []
        assert server.stderr is not None

        async def until_ready() -> None:
            assert server.stderr is not None
            while True:
                line = (await server.stderr.readline()).decode()
                if not line:
                    raise AssertionError("the agent ended early:\n" + "".join(lines))
                lines.append(line)
                if ready in line:
                    return

        await asyncio.wait_for(until_ready(), timeout)
        # Keep draining its log so a full pipe never blocks it.
        self.log_reader = asyncio.ensure_future(self._read_all(server.stderr, lines))
        return lines

    @staticmethod
    async def _read_all(stream: asyncio.StreamReader, lines: list[str]) -> None:
        while line := await stream.readline():
            lines.append(line.decode())

    async def run_callers(self, out: Path, calls: int, seconds: float,
                          connect_timeout: float, timeout: float) -> str:
        """`tests.support.rtc_caller` in the home namespace; returns its stderr. Meanwhile
        `agent_udp_ports` collects the UDP ports the agent's process holds (every 0.2 s)."""
        caller = await self.start(
            self.home, sys.executable, "-m", "tests.support.rtc_caller", self.public_url,
            "--calls", str(calls), "--seconds", str(seconds),
            "--connect-timeout", str(connect_timeout), "--out", str(out))
        watch = asyncio.ensure_future(self._watch_agent_ports())
        try:
            _, stderr = await asyncio.wait_for(caller.communicate(), timeout)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        return stderr.decode()

    async def _watch_agent_ports(self) -> None:
        agent = next(p for p in self.processes if p.returncode is None)
        while True:
            self.agent_udp_ports |= udp_ports_of(agent.pid)
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        for process in self.processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(process.wait(), 10)
        if self.log_reader is not None:
            self.log_reader.cancel()
            await asyncio.gather(self.log_reader, return_exceptions=True)
            self.log_reader = None

    def teardown(self) -> None:
        for namespace in reversed(self.namespaces):
            with contextlib.suppress(Exception):
                _run("ip", "netns", "del", namespace)
        self.namespaces.clear()


@contextlib.contextmanager
def _built(lab: NatLab) -> Iterator[NatLab]:
    try:
        lab.build()
        yield lab
    finally:
        lab.teardown()


@contextlib.asynccontextmanager
async def nat_lab(open_udp: Sequence[int] | str) -> AsyncIterator[NatLab]:
    """The lab with `open_udp` (a port, or "LOW-HIGH") open to the agent; everything in it
    stopped and every namespace deleted on the way out."""
    ports = open_udp if isinstance(open_udp, str) else ", ".join(map(str, open_udp))
    if "," in ports:
        ports = "{ " + ports + " }"
    lab = NatLab(tag=f"nat{uuid.uuid4().hex[:6]}", open_udp=ports)
    with _built(lab):
        try:
            yield lab
        finally:
            await lab.stop()
