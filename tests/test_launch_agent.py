"""The exec agent runs commands only for callers holding the run's keys (real sockets, real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hvd_magic.hub import RunKeys
from hvd_magic.launch.task.agent import ExecAgent
from hvd_magic.protocol import ENV_AGENT_TOKEN, ENV_AGENTS, Exec
from hvd_magic.rank.client import HubClient

from .helpers import forged_token


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
