"""Deterministic request logs for the request-log blob tests (tests/test_request_log_blobs.py):
every kind of message, failed and warmup requests, missing usage, spec columns, jittered times.
The fixture tests/fixtures/request_logs/v1_*.bin was written from these by the version-1 encoder
as it was before issue 22 (commit 5fd05cc)."""

from __future__ import annotations

import random

from benchkit.measure.logs import KINDS, MessageEvent, RequestLog

MS = 1_000_000


def sample_logs(spec: bool, n: int = 12, seed: int = 22) -> list[RequestLog]:
    """`n` request logs from `seed`; with `spec`, the per-request spec columns are set."""
    rng = random.Random(seed)
    logs = []
    for i in range(n):
        send = 10_000 * MS + i * 7 * MS + rng.randrange(1000)
        t, events = send, []
        for _ in range(rng.randrange(0, 40)):
            t += rng.randrange(0, 30 * MS)
            events.append(MessageEvent(t_ns=t, tokens=rng.randrange(0, 5), kind=rng.choice(KINDS)))
        ok = rng.random() > 0.2
        logs.append(RequestLog(
            index=i, warmup=i < 2, send_ns=send, events=events, ok=ok, error="" if ok else "http 500: boom ü",
            prompt_tokens=rng.choice([None, 17]), completion_tokens=rng.choice([None, sum(e.tokens for e in events)]),
            tokens_from_text=rng.random() < 0.3, input_len=17, output_len=40, end_ns=t + rng.randrange(MS),
            spec_steps=rng.randrange(1, 9) if spec else None, spec_draft_tokens=rng.randrange(9) if spec else None,
            spec_accepted_tokens=rng.randrange(9) if spec else None,
            spec_histogram=[rng.randrange(4) for _ in range(3)] if spec else None))
    return logs
