"""A server that dies after it was ready is described as dying while serving, not 'at ready'."""

from __future__ import annotations

from search.logwatch import LogClassifier, describe


def test_a_death_after_ready_reads_while_serving() -> None:
    classifier = LogClassifier()
    for line in [
        "[2026-02-19 05:48:17] The server is fired up and ready to roll!",
        "[2026-02-19 05:50:01 TP3] Scheduler hit an exception: Traceback (most recent call last):",
        "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
        "[2026-02-19 05:50:01] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
    ]:
        classifier.feed(line)
    assert classifier.failure is not None
    assert describe(classifier.failure) == (
        "NCCL error while serving: RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"
    )
