"""The exec agent runs commands only for callers holding the run's keys (real sockets, real processes)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import psutil
import pytest

from hvd_magic.hub import RunKeys
from hvd_magic.launch.task import agent as agent_module
from hvd_magic.launch.task.agent import ExecAgent
from hvd_magic.protocol import ENV_AGENT_TOKEN, ENV_AGENTS, Exec
from hvd_magic.rank.hub_client import HubClient

from .helpers import forged_token, wait_for_files


@pytest.fixture
def agent():
    keys = RunKeys.generate()
    a = ExecAgent("127.0.0.1", keys, "hvd-host-0", {"FROM_AGENT": "yes"})
    yield a
    a.close()


def _rsh(agent: ExecAgent, token: str, host: str, command: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{ENV_AGENTS: json.dumps({"hvd-host-0": agent.address}), ENV_AGENT_TOKEN: token})
    return subprocess.run(
        [sys.executable, "-m", "hvd_magic.launch.task.agent", host, command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_rsh_client_runs_command_through_agent(agent):
    done = _rsh(
        agent, agent.keys.client_token(), "hvd-host-0", "echo $FROM_AGENT $HVD_MAGIC_VIA_AGENT; exit 7"
    )
    assert done.stdout.strip() == "yes hvd-host-0"
    assert done.returncode == 7
    assert agent.launches == 1


def test_a_command_that_comes_before_its_hosts_plan_waits_for_it():
    """mpirun's rsh client can reach an executor's agent before that executor's task applied the
    launch plan: the ranks started without their GPUs, shards or thread budget."""
    keys = RunKeys.generate()
    late = ExecAgent("127.0.0.1", keys, "", {})
    try:
        placing = threading.Timer(1.0, late.place, args=("hvd-host-0", {"FROM_AGENT": "placed"}))
        placing.start()
        done = _rsh(late, keys.client_token(), "hvd-host-0", "echo $FROM_AGENT $HVD_MAGIC_VIA_AGENT")
        placing.join()
    finally:
        late.close()
    assert done.stdout.strip() == "placed hvd-host-0" and done.returncode == 0


def test_wrong_keys_run_nothing(agent):
    client = HubClient(agent.address, forged_token(agent.keys.server_public), rank=-1)
    client.send(Exec("touch /tmp/hvd_magic-should-not-exist"))
    assert client.receive(timeout=2) is None
    client.close()
    assert agent.launches == 0 and agent.refused_handshakes >= 1
    assert not os.path.exists("/tmp/hvd_magic-should-not-exist")


def test_unknown_host_is_a_clear_error(agent):
    done = _rsh(agent, agent.keys.client_token(), "elsewhere", "true")
    assert done.returncode == 255 and "no exec agent for host 'elsewhere'" in done.stderr


def test_secret_is_not_on_the_command_line(agent):
    token = agent.keys.client_token()
    env = dict(os.environ, **{ENV_AGENTS: json.dumps({"hvd-host-0": agent.address}), ENV_AGENT_TOKEN: token})
    process = subprocess.Popen(
        [sys.executable, "-m", "hvd_magic.launch.task.agent", "hvd-host-0", "ps -ww -eo args"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    table, _ = process.communicate(timeout=60)
    assert "hvd_magic.launch.task.agent hvd-host-0" in table  # we did see our own processes
    for secret in token.split(","):
        assert secret not in table


def test_a_command_whose_caller_stops_pinging_is_stopped_and_the_agent_says_so(monkeypatch, tmp_path):
    """mpirun's rsh client pings each second; one silent for PING_TIMEOUT has its command (an
    orted and the ranks under it) stopped, and the agent says so to the notebook (its task's
    client): a rank interrupted that way is no mystery in the run's error."""
    monkeypatch.setattr(agent_module, "PING_TIMEOUT", 1.0)
    said: queue.Queue[str] = queue.Queue()
    keys = RunKeys.generate()
    agent = ExecAgent("127.0.0.1", keys, "hvd-host-0", {}, say=said.put)
    client = HubClient(agent.address, keys.client_token(), rank=-1)
    try:
        client.send(Exec(f"echo $$ > {tmp_path}/pid; exec sleep 120"))  # and never a ping
        line = said.get(timeout=60)
        assert line.startswith("hvd_magic: the exec agent on tcp://127.0.0.1:") and "no ping for 1 s" in line
        assert wait_for_files([tmp_path / "pid"], timeout=30)
        pid, deadline = int((tmp_path / "pid").read_text()), time.monotonic() + 30
        while psutil.pid_exists(pid) and time.monotonic() < deadline:  # the agent reaps it
            time.sleep(0.05)
        assert not psutil.pid_exists(pid), "the silent caller's command is still running"
    finally:
        client.close()
        agent.close()
