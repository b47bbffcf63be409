"""Hosts as a careless night meets them: a key file that is not there, an sshd without SFTP, an
emulated host whose Python has no SGLang, a secret the space names that this shell does not set."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from search.cli import main
from search.hosts.ssh import SSHHost
from search.profile import LaunchProfile
from tests.helpers import free_port
from tests.ssh.conftest import start_sshd

if TYPE_CHECKING:
    from conftest import Sshd

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's own Python: no SGLang, no search


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], sshd: Sshd, **fields: object) -> tuple[int, str, str]:
    entry = sshd.host(**fields).model_dump(mode="json", exclude_defaults=True)
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": [entry]}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["host", "check", "loop", "--hosts", str(tmp_path / "hosts.yaml")])
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def test_a_missing_key_file_is_bad_input_not_an_unreachable_host(sshd: Sshd, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _check(tmp_path, capsys, sshd, key_file=str(tmp_path / "no_such_key"), reconnect_delay=2)
    assert code == 2
    assert err == (f"error: host loop: key file {tmp_path / 'no_such_key'} does not exist; fix key_file in the "
                   "hosts file, or leave it out to use the SSH agent's keys\n")


def test_host_check_says_sftp_is_needed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = start_sshd(tmp_path / "sshd")
    try:
        server.stop()
        config = server.dir / "sshd_config"
        config.write_text(config.read_text().replace("Subsystem sftp internal-sftp\n", ""))
        server.start()
        code, _, err = _check(tmp_path, capsys, server, nvidia_smi=None)
    finally:
        server.stop()
    assert code == 1
    assert err.startswith("error: host loop: no SFTP session (") and err.count("\n") == 1
    assert "add `Subsystem sftp internal-sftp` to the host's sshd_config and reload sshd" in err


def test_an_emulated_host_reports_the_emulator_not_its_python(sshd: Sshd, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _check(tmp_path, capsys, sshd, emulate=True,
                            env={"SEARCH_EMULATOR_SGLANG_VERSION": "0.5.9"})
    assert code == 0, err
    assert "SGLang 0.5.9 (emulated by search.emulator on " in out
    code, _, err = _check(tmp_path, capsys, sshd, emulate=True, python=SYSTEM_PYTHON)
    assert code == 1 and "No module named 'search'" in err  # the emulator itself must be there


_SERVER = "import os, time; print('secret set' if 'SEARCH_UNSET_SECRET' in os.environ else 'no secret', flush=True); time.sleep(30)"


def test_an_unset_secret_is_skipped_over_ssh_as_locally(sshd: Sshd, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    host = SSHHost(sshd.host())
    profile = LaunchProfile(launcher=["python3", "-c", _SERVER], args=[], env={}, port=free_port(),
                            secret_env=["SEARCH_UNSET_SECRET"], host="127.0.0.1", sglang_version="0.5.23")
    with caplog.at_level(logging.WARNING):
        handle = host.start(profile, marker="trial-unset", log_path=tmp_path / "trial" / "server.log")
        try:
            assert handle.new_lines(timeout=30) == ["no secret"]
        finally:
            handle.stop(grace=2)
            host.close()
    warned = ("warning: secret SEARCH_UNSET_SECRET named by the space is not set here; servers start without it "
              "(a public model needs none; export it for a gated one)")
    assert [r.getMessage() for r in caplog.records if "SEARCH_UNSET_SECRET" in r.getMessage()] == [warned]
