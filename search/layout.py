"""The parallel layout of a server: how many GPUs its flags take, and the rules SGLang puts on them.

A trial's GPU count decides where it can run (`search.slots`), and a layout flag searched like any
other (`--tp-size`, `--dp-size`, `--enable-dp-attention`, `--attn-dp-size`, `--ep-size`,
`--pp-size`) changes it. The count and the rules below are copied from SGLang's own source; each
rule names the file and line of the wheel it comes from (``.whl/src/sglang-<version>/``), so a
new release that changes one is found by reading that line again.

The layout is read from the rendered argv (every spelling SGLang's parser accepts, the last one
given winning as in argparse), never from a manifest: the runner needs it for live manifests too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Each layout value and the options that set it (all SGLang versions shipped; unique prefixes are
# refused by `search space check`, so full spellings are all a space can render).
_OPTIONS: dict[str, tuple[str, ...]] = {
    "tp": ("--tp-size", "--tensor-parallel-size", "--tp"),
    "dp": ("--dp-size", "--data-parallel-size", "--dp"),
    "pp": ("--pp-size", "--pipeline-parallel-size"),
    "ep": ("--ep-size", "--expert-parallel-size", "--ep"),
    "attn_dp": ("--attn-dp-size", "--attention-data-parallel-size"),
}
_DP_ATTENTION = "--enable-dp-attention"
LAYOUT_FLAGS = frozenset({_DP_ATTENTION, *(o for options in _OPTIONS.values() for o in options)})


@dataclass(frozen=True)
class Layout:
    """A server's parallel sizes, as its command line gives them (SGLang's defaults: all 1)."""

    tp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1
    attn_dp: int = 1  # --attn-dp-size (0.5.23)
    dp_attention: bool = False  # --enable-dp-attention (deprecated in 0.5.23)

    @classmethod
    def of(cls, args: Sequence[str]) -> Layout:
        """The layout ``args`` (SGLang flags) ask for; a value that is not an integer counts as 1."""
        values: dict[str, int] = {}
        dp_attention = False
        for i, arg in enumerate(args):
            name, eq, text = arg.partition("=")
            if name == _DP_ATTENTION:
                dp_attention = True
                continue
            for key, options in _OPTIONS.items():
                if name in options:
                    given = text if eq else (args[i + 1] if i + 1 < len(args) else "")
                    values[key] = int(given) if given.strip().isdigit() else 1
        return cls(dp_attention=dp_attention, **values)

    @property
    def attention_dp(self) -> int:
        """The attention-DP width: 0.5.23 turns ``--dp-size N --enable-dp-attention`` into
        ``--attn-dp-size N`` when no width is given (sglang-0.5.23 srt/arg_groups/parallel_hook.py:50-61)."""
        if self.attn_dp > 1:
            return self.attn_dp
        return self.dp if self.dp_attention else 1

    @property
    def replicas(self) -> int:
        """Data-parallel replicas, each a whole tp x pp group; with attention DP, dp counts inside tp."""
        return 1 if self.dp_attention and self.attn_dp == 1 else self.dp

    @property
    def gpus(self) -> int:
        """GPUs the server takes: dp x tp x pp, attention DP adding none.

        sglang-0.5.23 srt/server_args.py:581-589 (compute_world_size: "Attention DP runs inside the
        TP group, so it adds no GPUs"); sglang-0.5.9 srt/managers/data_parallel_controller.py:246
        (each replica starts tp x pp GPUs after the previous one).
        """
        return self.replicas * self.tp * self.pp

    def problems(self, host_gpus: int | None = None) -> list[str]:
        """What SGLang refuses (or silently ignores) in this layout, and what the host cannot hold."""
        out: list[str] = []
        if self.dp_attention and self.dp <= 1 and self.attn_dp <= 1:
            # sglang-0.5.9 srt/server_args.py:2110-2111 turns it off at dp 1; 0.5.23 parallel_hook.py:50-61
            # moves dp (1) into attn_dp: either way nothing runs in attention DP, and the trial measures nothing new.
            out.append("--enable-dp-attention needs --dp-size > 1 (at dp 1 SGLang turns it off)")
        if self.attn_dp > 1 and self.dp > 1:
            # sglang-0.5.23 srt/arg_groups/parallel_hook.py:287-292
            out.append(f"--dp-size {self.dp} with --attn-dp-size {self.attn_dp}: SGLang does not support replicas "
                       "combined with attention data parallelism")
        if self.attention_dp > 1 and self.tp % self.attention_dp:
            # sglang-0.5.9 srt/server_args.py:2116; sglang-0.5.23 srt/arg_groups/parallel_hook.py:326
            out.append(f"attention DP {self.attention_dp} must divide --tp-size {self.tp}")
        if self.ep > 1 and self.tp % self.ep:
            # sglang-0.5.23 srt/model_executor/model_runner_components/moe_ep_setup.py:150-153;
            # sglang-0.5.9 srt/model_executor/model_runner.py:705-708
            out.append(f"--tp-size {self.tp} must be divisible by --ep-size {self.ep}")
        if host_gpus is not None and (self.gpus > host_gpus or host_gpus % self.gpus):
            out.append(f"{self.describe()} takes {self.gpus} GPU(s), which must divide the host's {host_gpus}")
        return out

    def describe(self) -> str:
        """``tp 2 x dp 2 (attention) x pp 1`` for messages."""
        dp = f"dp {self.attention_dp} (attention)" if self.attention_dp > 1 else f"dp {self.dp}"
        return f"tp {self.tp} x {dp} x pp {self.pp}" + (f", ep {self.ep}" if self.ep > 1 else "")


def gpus_needed(args: Sequence[str]) -> int:
    """GPUs a server started with ``args`` takes (see :attr:`Layout.gpus`)."""
    return Layout.of(args).gpus
