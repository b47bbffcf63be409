"""`search host check` through the real sshd: version from the remote Python, GPUs, free or not."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from search import gpu
from search.cli import main
from search.cli.host import report_gpus
from search.errors import RunFailed

if TYPE_CHECKING:
    from conftest import Sshd

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvidia-smi"


def _replay(fixture: str) -> list[str]:
    """An nvidia-smi command that prints captured real output (the query flags land in $1..)."""
    return ["sh", "-c", 'cat "$0"', str(FIXTURES / fixture)]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _check(sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str, **fields: object) -> Result:
    """Run the CLI entry point in-process (the remote side is still a real sshd and Python)."""
    entry = sshd.host(**fields).model_dump(mode="json", exclude_defaults=True)
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [entry]}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["host", "check", "loop", "--hosts", str(tmp_path / "hosts.yaml"), *extra])
    out, err = capsys.readouterr()
    return Result(int(exited.value.code or 0), out, err)


def test_check_refuses_an_unknown_key_then_reports_version_and_real_gpu_output(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    known = tmp_path / "known_hosts"
    idle = _replay("h200-idle.csv")
    refused = _check(sshd, tmp_path, capsys, known_hosts=known, nvidia_smi=idle)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "unknown host key" in refused.stderr
    assert not known.exists()
    result = _check(sshd, tmp_path, capsys, "--accept-new-host-key", known_hosts=known, nvidia_smi=idle, gpus=[0])
    assert result.returncode == 0, result.stderr
    assert known.read_text() == sshd.host_key_line + "\n"
    out = result.stdout
    assert f"host loop (root@127.0.0.1:{sshd.port}): connected" in out
    assert "SGLang 0.5.23 (" in out and " flags" in out  # built live by the remote Python
    assert "143771 MiB" in out and "700 W" in out and "81 W" in out
    assert out.rstrip().endswith("GPUs 0: free")


def test_busy_or_unknown_gpus(sshd: Sshd, capsys: pytest.CaptureFixture[str]) -> None:
    config = sshd.host(gpus=[0, 1])
    loaded = gpu.parse((FIXTURES / "h200-matmul.csv").read_text().splitlines()[-1])
    with pytest.raises(RunFailed, match=r"host loop: GPUs not free: GPU 0: 1139 MiB used; GPU 1: not reported"):
        report_gpus(config, loaded)
    assert "100 %" in capsys.readouterr().out
    report_gpus(config, None)
    assert "GPUs: not checked (nvidia_smi: null in the hosts file)" in capsys.readouterr().out


def test_a_missing_gpu_command_is_an_error_unless_gpu_checks_are_off(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = _check(sshd, tmp_path, capsys, nvidia_smi="nvidia-smi-typo --flag")
    assert typo.returncode == 1 and typo.stderr.count("\n") == 1, typo
    assert "GPU query `nvidia-smi-typo --flag` not found there" in typo.stderr
    assert "set nvidia_smi in the hosts file" in typo.stderr and "nvidia_smi: null" in typo.stderr
    assert "GPUs" not in typo.stdout  # never reported free

    off = _check(sshd, tmp_path, capsys, nvidia_smi=None)
    assert off.returncode == 0, off.stderr
    assert off.stdout.rstrip().endswith("GPUs: not checked (nvidia_smi: null in the hosts file)")
