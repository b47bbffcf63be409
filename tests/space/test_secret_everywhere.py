"""One secret rule wherever a value enters: a launch command (`space check --command`,
`--start-from`) and hosts.yaml refuse a secret's value with the same advice as a space file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from search.command import config_from_command
from search.errors import BadInput
from search.hosts.config import load_hosts
from search.secret_rule import secret_advice
from search.space import parse_space

Cli = Callable[..., tuple[int, str, str]]
LAUNCH = "python -m sglang.launch_server --model-path m --tp 1"


@pytest.mark.parametrize("command, name", [
    (f"{LAUNCH} --api-key sk-123", "--api-key"),
    (f"{LAUNCH} --ssl-keyfile-password=pw", "--ssl-keyfile-password"),
    (f"HF_TOKEN=hf_abc {LAUNCH}", "HF_TOKEN"),
])
def test_space_check_command_refuses_a_secret_value(cli: Cli, command: str, name: str) -> None:
    code, out, _ = cli("space", "check", "--command", command, "--sglang-version", "0.5.23")
    assert code == 2
    assert f"a secret's value is written here (allowed: {secret_advice(name)})" in out
    assert "sk-123" not in out and "hf_abc" not in out


def test_start_from_with_a_token_gives_the_secret_advice() -> None:
    space = parse_space({"sglang_version": "0.5.23", "launch": {"model": "m", "tp": 1, "secret_env": ["HF_TOKEN"]},
                         "params": {"--max-running-requests": {"type": "categorical", "choices": [64, 128]}}})
    with pytest.raises(BadInput) as info:
        config_from_command(space, f"HF_TOKEN=hf_abc {LAUNCH} --max-running-requests 64 --api-key sk-123")
    message = str(info.value)
    assert secret_advice("HF_TOKEN") in message and secret_advice("--api-key") in message
    assert "launch.env" not in message and "launch.flags" not in message  # never advise writing it down


def test_hosts_file_refuses_a_secret_in_env(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  - {name: a, address: 10.0.0.1, user: u, env: {HF_TOKEN: hf_abc}}\n")
    with pytest.raises(BadInput, match="hosts.0.env") as info:
        load_hosts(path)
    assert secret_advice("HF_TOKEN") in str(info.value) and "hf_abc" not in str(info.value)
