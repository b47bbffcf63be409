"""The emulator's parallel layouts: a rank per GPU of dp x tp x pp, and servers on disjoint GPUs side by side."""

from __future__ import annotations

from pathlib import Path

from search.emulator import gpu_state
from tests.emulator.conftest import client


def test_replicas_take_a_gpu_per_rank_and_two_servers_share_a_host(start, small_landscape, tmp_path: Path) -> None:
    state = str(tmp_path / "host")  # one emulated host of 8 GPUs for both servers
    replicas = start(["--model-path", "m", "--tp-size", "2", "--dp-size", "2"], SEARCH_EMULATOR_STATE_DIR=state,
                     CUDA_VISIBLE_DEVICES="0,1,2,3", **small_landscape)
    attention = start(["--model-path", "m", "--tp-size", "4", "--dp-size", "4", "--enable-dp-attention"],
                      SEARCH_EMULATOR_STATE_DIR=state, CUDA_VISIBLE_DEVICES="4,5,6,7", **small_landscape)
    replicas.wait_ready()
    attention.wait_ready()
    held = [i for i in range(8) if gpu_state.is_held(Path(state), i)]
    assert held == list(range(8)), "2 replicas x tp 2 on GPUs 0-3, tp 4 with attention DP inside on 4-7"
    for server in (replicas, attention):
        with client(server) as http:
            answer = http.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 4})
            assert answer.status_code == 200
    assert "unbalanced" not in replicas.text() + attention.text(), "neither saw the other's GPUs as taken"


def test_the_seed_landscape_prices_the_layout() -> None:
    from search.emulator.landscape import Landscape
    from search.emulator.launch import parse_flags, world_size

    seed = Landscape.load(None)

    def rate(args: list[str], running: int) -> float:
        return seed.throughput(parse_flags("0.5.9", ["--model-path", "m", *args]), {}, running)

    tp8, dp_attention = ["--tp-size", "8"], ["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"]
    assert world_size(parse_flags("0.5.9", ["--model-path", "m", *dp_attention])) == 8
    assert rate(dp_attention, 1024) > rate(tp8, 1024) and rate(dp_attention, 64) < rate(tp8, 64)
    assert rate(["--tp-size", "4", "--pp-size", "2"], 1024) < rate(tp8, 1024)  # pipeline bubbles
