"""`search host ...`: check a remote GPU machine from the hosts file before a night's study."""

from __future__ import annotations

from pathlib import Path

import typer

from search import gpu
from search.errors import RunFailed
from search.host_checks import check_sftp, host_manifest
from search.hosts.base import GpuSample
from search.hosts.config import HostConfig, load_hosts
from search.hosts.ssh import SSHHost

app = typer.Typer(help="Remote GPU hosts (hosts.yaml): check one before running a study there.", no_args_is_help=True)


@app.command("check")
def check(
    name: str = typer.Argument(..., help="The host's name in the hosts file."),
    hosts: Path = typer.Option(Path("hosts.yaml"), "--hosts", help="The hosts file."),
    accept_new_host_key: bool = typer.Option(
        False, "--accept-new-host-key", help="Record the host's key in known_hosts if it has none (never a changed one)."
    ),
) -> None:
    """Connect; report SGLang's version (its flag manifest built live), the GPUs and whether they are free.

    Exits 1 when a GPU the host is configured to use is busy or missing, or the GPU query fails
    (set ``nvidia_smi: null`` for a host without GPU checks), 2 on a bad hosts file or host key,
    1 when the host cannot be reached.
    """
    config = load_hosts(hosts).get(name)
    host = SSHHost(config, accept_new_host_key=accept_new_host_key)
    try:
        typer.echo(f"host {config.target}: connected, work dir {host.work_dir()}")
        check_sftp(host)
        manifest, source = host_manifest(host)
        typer.echo(f"SGLang {manifest.version} ({source}): {len(manifest.flags)} flags")
        samples = host.gpu_samples()
    finally:
        host.close()
    report_gpus(config, samples)


def report_gpus(config: HostConfig, samples: list[GpuSample] | None) -> None:
    """Print the GPU table and verdict; RunFailed when a GPU the host should use is busy or missing.

    ``samples`` is None only when the hosts file turned GPU checks off (``nvidia_smi: null``).
    """
    if samples is None:
        typer.echo("GPUs: not checked (nvidia_smi: null in the hosts file)")
        return
    typer.echo(_table(samples))
    wanted = config.gpus if config.gpus is not None else [s.index for s in samples]
    reasons = gpu.busy(samples, wanted)
    if reasons:
        raise RunFailed(f"host {config.name}: GPUs not free: {'; '.join(reasons)}")
    typer.echo(f"GPUs {','.join(map(str, wanted))}: free")


def _table(samples: list[GpuSample]) -> str:
    def number(value: float | None, unit: str) -> str:
        return f"{value:.0f} {unit}" if value is not None else "n/a"

    rows = [("GPU", "memory used", "memory total", "power", "power limit", "utilization")]
    rows += [
        (str(s.index), number(s.memory_used_mib, "MiB"), number(s.memory_total_mib, "MiB"),
         number(s.power_w, "W"), number(s.power_limit_w, "W"), number(s.utilization_pct, "%"))
        for s in samples
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
