"""`search study run --ray` with no address means `--ray auto`, wherever it stands on the command
line; given an address, it is that address. (The --hosts clash names the address the command was
given, so these run without a cluster; test_node_death runs a whole study with a bare --ray.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from search.cli import app
from search.cli.study import bare_ray
from search.errors import BadInput

SPACE = str(Path(__file__).resolve().parents[2] / "spaces" / "demo.yaml")


@pytest.mark.parametrize("args, address", [
    ([SPACE, "--study", "s", "--hosts", "h.yaml", "--ray"], "auto"),  # last
    ([SPACE, "--study", "s", "--ray", "--hosts", "h.yaml"], "auto"),  # before another option
    (["--ray", SPACE, "--study", "s", "--hosts", "h.yaml"], "auto"),  # before the space file
    ([SPACE, "--study", "s", "--ray", "10.0.0.5:6379", "--hosts", "h.yaml"], "10.0.0.5:6379"),
    ([SPACE, "--study", "s", "--ray=auto", "--hosts", "h.yaml"], "auto"),
])
def test_the_ray_address_the_command_runs_with(args: list[str], address: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, ["study", "run", *args])
    assert isinstance(done.exception, BadInput), done.output
    assert f"--ray {address} runs each trial on a Ray node's own machine" in str(done.exception), done.output


def test_only_a_bare_ray_is_completed() -> None:
    assert bare_ray(["s.yaml", "--ray", "auto"]) == ["s.yaml", "--ray", "auto"]
    assert bare_ray(["s.yaml", "--", "--ray"]) == ["s.yaml", "--", "--ray"]  # after --, it is no option
    assert bare_ray(["s.yaml"]) == ["s.yaml"]
