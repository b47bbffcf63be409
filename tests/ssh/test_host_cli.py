"""`search host check` through the real sshd: version from the remote Python, GPUs, free or not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from search.hosts.ssh import SSHHost

if TYPE_CHECKING:
    from conftest import Sshd

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvidia-smi"


def _replay(fixture: str) -> list[str]:
    """An nvidia-smi command that prints captured real output (the query flags land in $1..)."""
    return ["sh", "-c", 'cat "$0"', str(FIXTURES / fixture)]


def _check(sshd: Sshd, tmp_path: Path, *extra: str, **fields: object) -> subprocess.CompletedProcess[str]:
    entry = sshd.host(**fields).model_dump(mode="json", exclude_defaults=True)
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [entry]}))
    return subprocess.run(
        [sys.executable, "-c", "import sys; from search.cli import main; main(sys.argv[1:])", "host", "check", "loop", "--hosts", str(tmp_path / "hosts.yaml"), *extra],
        capture_output=True, text=True, timeout=120,
    )


def test_check_reports_version_and_real_gpu_output(sshd: Sshd, tmp_path: Path) -> None:
    result = _check(sshd, tmp_path, nvidia_smi=_replay("h200-idle.csv"), gpus=[0])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"host loop (root@127.0.0.1:{sshd.port}): connected" in out
    assert "SGLang 0.5.23 (" in out and " flags" in out
    assert "143771 MiB" in out and "700 W" in out and "81 W" in out
    assert out.rstrip().endswith("GPUs 0: free")


def test_unknown_host_key_needs_the_flag_and_busy_gpus_fail_the_check(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    busy = _replay("h200-matmul.csv")  # eight rounds of one GPU under load
    refused = _check(sshd, tmp_path, known_hosts=known, nvidia_smi=busy)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "unknown host key" in refused.stderr
    accepted = _check(sshd, tmp_path, "--accept-new-host-key", known_hosts=known, nvidia_smi=busy, gpus=[0])
    assert known.read_text() == sshd.host_key_line + "\n"
    assert accepted.returncode == 1
    assert accepted.stderr == "error: host loop: GPUs not free: GPU 0: 1139 MiB used\n"
    assert "100 %" in accepted.stdout and "SGLang 0.5.23" in accepted.stdout


def test_missing_nvidia_smi_is_reported_not_fatal(sshd: Sshd) -> None:
    host = SSHHost(sshd.host(nvidia_smi="no-such-nvidia-smi"))
    assert host.gpu_samples() is None
    host.close()
