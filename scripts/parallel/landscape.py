"""Emulator landscape for scripts/bench_parallel.py: every config starts and completes, and the
startup phases (sleeps in the emulator, so little CPU) dominate a trial as they do on real GPUs."""


def startup(flags, env):
    return None


def throughput(flags, env, running):
    return 200.0 * running ** 0.5


def phase_seconds(flags, env):
    # 1000 s at time scale 1; the benchmark's default scale 0.01 makes it 10 s per start.
    return {"starting": 50, "loading": 500, "kv_cache": 100, "autotune": 200, "cuda_graph": 100, "warmup": 50}
