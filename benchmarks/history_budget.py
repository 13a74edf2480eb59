"""Page budgets on the real PostgreSQL (issues 9 and 22): home, sweep, compare and trend pages
and their JSON, and the admin's big lists, at about 1k, 10k, 100k and 1M stored runs of one
nightly series.

    .venv/bin/python benchmarks/history_budget.py \\
        [--database-url postgres://postgres@127.0.0.1:5432/draftboard_hist_bench] \\
        [--levels 10000,100000,1000000] [--rounds 20] [--live-too] [--measure-only] [--categories 11]

The database named in the URL is dropped and created afresh (it must not be one you use).
Nightly sweeps have the users' grid axes (TP 1/4/8 x auto/linear/DDTree b15/b16/b32/b64),
widened by concurrency, output and input lengths and repeats. The pages show the newest
NIGHTS = 30 nights (the trend page's default window), and those are the same at 10k, 100k and
1M: the database grows with older, wider nights of the same series, so a page's cost can be
compared across levels (issue 22: "flat in database size"; before, each level also widened the
nights shown, and the pages cost what the shown sweep's points cost):

| level | stored (oldest first) | runs |
| --- | --- | --- |
| 1k | 30 nights of 36 runs (the users' grid: concurrency 1/8, 1024 tokens) | 1 080 |
| 10k | 30 nights of 324 (concurrency 1..32, 3 repeats) | 9 720 |
| 100k | 28 nights of 3 240 (concurrency 1..32, output 128..2048, input 512/2048, 3 repeats), then the 10k's | 100 440 |
| 1M | 306 nights of 3 240, then the 10k level's 30: a results database years old | 1 001 160 |

Where a level has 3 240-run nights, the sweep, its JSON and compare pages are also measured on
the last two of them ("..., 3 240 runs"). The admin is measured logged in as a superuser: the
run list (plain, TP 8, state failed, searched by a point key's first 10 characters, by model
text, by a rare phrase), the metrics list and a 3 240-run sweep's change page.

Seeding is bulk: each era's first night and its last are stored by the ORM (bulk_create in
batches of 2 000; every run succeeded with a full RunMetrics row, every WindowMetrics column,
4 x 64 distribution samples, a 2 KB server-log tail, argv and spec as a real run stores them);
the nights between are copies of the first made by PostgreSQL itself (one `INSERT ... SELECT`
of the runs and one of their RunMetrics rows per night): same columns and sizes, so the tables
are as big as that many real runs make them; the seeding time is printed. Hardware snapshots
with one driver update; the last two nights have a planted 25 % drop (TP8 linear, concurrency
1) and regression detection runs on the last four nights through the real service (the last
one's time is printed). After seeding, the stored per-sweep point summaries are built (`manage.py
rebuild_summaries`, time printed); `--live-too` measures each level again with the summaries
deleted (the pages then read every run, as before issue 22). `--measure-only` measures the
database a previous call left (the last 30 sweeps as the shown nights).

Each page is fetched with Django's test client (the whole middleware and template stack, no
network; the process's heap frozen out of gc's reach first, as benchsite/wsgi.py does in a
served process) `--rounds` times after 2 warm-up requests: server time p50 / p95 in ms (wall
clock), the web process's CPU time p50 (its share without PostgreSQL's; other work on the
machine moves the wall clock, not this), response bytes, SQL queries (counted on one extra
request). Targets (issues 9, 22): p95 < 150 ms, < 500 KB per page, queries equal at every level,
p95 at the largest level within 1.5x of the smallest (the summary's last column). Prints a
table per level and a summary; never fails on a figure (exit 0), exit 2 when PostgreSQL is
unreachable.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import pct, print_table  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/draftboard_hist_bench"
NIGHTS = 30
METHODS = [("auto", None), ("linear", None), ("ddtree", 15), ("ddtree", 16), ("ddtree", 32), ("ddtree", 64)]
SHAPES = {  # name -> (concurrency, output_len, input_len, repeats); runs per night = 18 x the product
    "users": ([1, 8], [1024], [512], 1),  # 36 runs
    "wide": ([1, 2, 4, 8, 16, 32], [1024], [512], 3),  # 324 runs
    "widest": ([1, 2, 4, 8, 16, 32], [128, 256, 512, 1024, 2048], [512, 2048], 3),  # 3 240 runs
}
#: level -> the series' eras, oldest first: (shape, nights stored by the ORM, nights copied by
#: PostgreSQL from the era's first night). The last era is the NIGHTS nights the pages show.
LEVELS = {
    1000: [("users", NIGHTS, 0)],
    10000: [("wide", NIGHTS, 0)],
    100000: [("widest", 2, 26), ("wide", NIGHTS, 0)],
    1000000: [("widest", 2, 304), ("wide", NIGHTS, 0)],
}
P95_TARGET_MS, BYTES_TARGET = 150.0, 500_000
#: SPEED-Bench's qualitative categories: `--categories N` stores the first N on every run (issue 33).
CATEGORY_NAMES = ("coding", "humanities", "math", "multilingual", "qa", "rag", "reasoning", "roleplay", "stem",
                  "summarization", "writing")


def recreate_database(url: str) -> None:
    """Drop and create the database named in `url` (connecting to `postgres` on the same server)."""
    import psycopg

    u = urlparse(url)
    name = u.path.lstrip("/")
    admin = u._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def seed(level: int, rng: np.random.Generator, categories: int = 0) -> dict:
    """Store the level's eras of one nightly series (LEVELS: each era's first night and its
    other ORM nights by bulk_create, its copies by PostgreSQL), then judge the last night.
    Returns ids: "sweeps" (the shown era's nights, oldest first), "widest" (the last two ORM
    nights of a "widest" era, when the level has one), host, series, detection time and flags.
    `categories` > 0: every run is on a SPEED-Bench dataset and stores figures for that many
    categories (RunMetrics.categories, as runs.services.outcomes writes them), so the sweep page
    draws its category matrices."""
    import dataclasses

    from django.db import connection

    from benchkit.measure.metrics import METRIC_FIELDS
    from benchkit.specs import GpuRef, RunSpec, ServerConfig, WorkloadSpec
    from runs.models import HardwareSnapshot, Host, RegressionFlag, Run, RunMetrics, RunState, Sweep
    from runs.services import regressions
    from runs.services.hosts import record_inventory
    from runs.services.sweeps import run_fields
    from tests.nightly import AR_TOK_S, TAU, target_tok_s
    from tests.test_allocation import UUIDS, pcie8_inventory

    with connection.cursor() as cur:  # a clean slate per level
        cur.execute("TRUNCATE runs_regressionflag, runs_runmetrics, runs_runtransition, runs_requestlogblob, "
                    "runs_gpulease, runs_run, runs_sweep, runs_gpu, runs_hardwaresnapshot, runs_host CASCADE")
    eras = LEVELS[level]
    older = sum(orm + copied for _, orm, copied in eras[:-1])
    start = datetime(2026, 1, 1, 2, 0, tzinfo=UTC)  # night 1 of the shown era
    first_at = start - timedelta(days=older)
    host = Host.objects.create(name="ws-pcie8")
    inv = pcie8_inventory()
    s1 = record_inventory(host, dataclasses.replace(inv, driver_version="575.57.08"))
    s2 = record_inventory(host, dataclasses.replace(inv, driver_version="580.65.06"))
    HardwareSnapshot.objects.filter(pk=s1.pk).update(taken_at=first_at - timedelta(days=1))
    HardwareSnapshot.objects.filter(pk=s2.pk).update(taken_at=start + timedelta(days=9, hours=-1))
    gpus = {1: [GpuRef(index=0, uuid=UUIDS[0])], 4: [GpuRef(index=i, uuid=UUIDS[i]) for i in range(4)],
            8: [GpuRef(index=i, uuid=UUIDS[i]) for i in range(8)]}

    def grid(shape: str) -> list[tuple]:
        conc, outs, ins, repeats = SHAPES[shape]
        specs = [RunSpec(server=ServerConfig(engine="sglang", engine_build="sglang-ddtree-pr",
                                             model="/models/Qwen3.5-27B", method=method, tree_budget=budget,
                                             drafter="" if method == "auto" else "/models/Qwen3.5-27B-DFlash",
                                             tp=tp),
                         workload=WorkloadSpec(concurrency=c, output_len=o, input_len=i, num_prompts=64,
                                               ignore_eos=True),
                         gpus=gpus[tp], repeat_index=r)
                 for tp in (1, 4, 8) for method, budget in METHODS for c in conc for o in outs for i in ins
                 for r in range(repeats)]
        out = [(s, s.to_dict(), run_fields(s), s.point_key()) for s in specs]
        if categories:
            for _, _, fields, _ in out:
                fields["dataset"] = "speed_bench:/data/speed-bench"
        return out

    numeric = [f for f in METRIC_FIELDS if f.kind in (int, float)]
    log_tail = ("INFO sglang server ready; " * 80)[:2000]

    def store_night(per_spec: list[tuple], at: datetime, version: str, planted: bool) -> int:
        sweep = Sweep.objects.create(name="users-grid-wide", host=host, source="sweeps/users-grid-wide.yaml",
                                     spec={"name": "users-grid-wide"})
        Sweep.objects.filter(pk=sweep.pk).update(created_at=at)
        runs = [Run(sweep=sweep, host=host, point_key=key, spec=sd, state=RunState.SUCCEEDED, started_at=at,
                    finished_at=at + timedelta(minutes=1), engine_version=version,
                    argv=["python", "-m", "sglang.launch_server", "--tp-size", str(s.server.tp)],
                    server_log_tail=log_tail, **fields) for s, sd, fields, key in per_spec]
        Run.objects.bulk_create(runs, batch_size=2000)
        rows = []
        for run in runs:
            label = run.method_label
            c = run.concurrency if run.concurrency in (1, 8) else (1 if run.concurrency < 8 else 8)
            tok = target_tok_s(label, run.tp, c) * (run.concurrency / c) ** 0.5 * (1 + rng.uniform(-0.02, 0.02))
            if planted and (label, run.tp, run.concurrency) == ("linear", 8, 1):
                tok *= 0.75
            values = {f.name: float(rng.uniform(1, 100)) if f.kind is float else int(rng.integers(1, 1000))
                      for f in numeric}
            values.update(output_throughput_tok_s=tok, median_tpot_ms=1000.0 * run.concurrency / tok,
                          median_ttft_ms=60.0 + run.input_len / 20, acceptance_length=TAU.get(label),
                          per_position_acceptance_rate=[0.8, 0.6, 0.5, 0.4])
            cats = [{"category": name, "requests": 8, "completed": 8, "failed": 0,
                     "median_ttft_ms": values["median_ttft_ms"], "median_itl_ms": values["median_tpot_ms"],
                     "median_tpot_ms": values["median_tpot_ms"] * float(rng.uniform(0.8, 1.25)),
                     "output_tokens": 8 * run.output_len, "output_throughput_tok_s": tok / categories,
                     "output_share": 1 / categories, "tau_request_weighted": TAU.get(label),
                     "tau_token_weighted": TAU.get(label), "spec_requests": 0 if label == "auto" else 8,
                     "acceptance_per_position": [0.8, 0.6, 0.5, 0.4], "mean_decode_tokens_per_chunk": 2.0}
                    for name in CATEGORY_NAMES[:categories]]
            rows.append(RunMetrics(run=run, spec_source="sglang", **values, categories=cats, distributions={
                k: [round(float(x), 3) for x in rng.gamma(2, 5, 64)] for k in ("ttft_ms", "itl_ms", "icl_ms",
                                                                              "tokens_per_chunk")}))
        RunMetrics.objects.bulk_create(rows, batch_size=2000)
        return sweep.pk

    at = first_at
    widest: list[int] = []
    for n_era, (shape, orm, copied) in enumerate(eras):
        per_spec = grid(shape)
        shown = n_era == len(eras) - 1
        era = []
        for night in range(1, orm + 1):
            version = ("0.5.3" if night > 20 else "0.5.2") if shown else "0.5.1"
            era.append(store_night(per_spec, at, version, shown and night >= NIGHTS - 1))
            at += timedelta(days=1)
            if night == 1 and copied:
                t0 = time.perf_counter()
                dates = [at + timedelta(days=k) for k in range(copied)]
                copy_nights(era[0], dates)
                at += timedelta(days=copied)
                print(f"  {copied} nights of {len(per_spec)} runs copied by PostgreSQL in "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
        if shape == "widest":
            widest = era[-2:]
    sweeps = era
    assert at == start + timedelta(days=NIGHTS), "the shown era ends on its NIGHTS-th night"
    assert AR_TOK_S  # the users' figures come from tests/nightly.py
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    for pk in sweeps[-4:-1]:  # the nights before, judged as the worker would have
        regressions.detect_for_sweep(pk)
    t0 = time.perf_counter()
    det = regressions.detect_for_sweep(sweeps[-1])
    detect_ms = (time.perf_counter() - t0) * 1000
    flags = RegressionFlag.objects.count()
    return {"sweeps": sweeps, "widest": widest, "host": host.name, "series": "users-grid-wide",
            "detect_ms": detect_ms, "flags": flags, "runs": Run.objects.count(), "last_flags": len(det.flagged)}


def copy_nights(template: int, dates: list[datetime]) -> list[int]:
    """Copy sweep `template` (its runs and their RunMetrics rows) once per date, server-side:
    a new sweep dated then, and one `INSERT ... SELECT` each for its runs and metrics. Returns
    the new sweeps' ids, in order."""
    from django.db import connection

    from runs.models import Run, RunMetrics, Sweep

    run_cols = [f.column for f in Run._meta.concrete_fields if f.column not in ("id", "sweep_id")]
    metric_cols = [f.column for f in RunMetrics._meta.concrete_fields if f.column not in ("id", "run_id")]
    q = connection.ops.quote_name
    shifted = [f"{q(c)} + %s" if c in ("started_at", "finished_at") else q(c) for c in run_cols]
    runs_sql = (f"INSERT INTO runs_run (sweep_id, {', '.join(q(c) for c in run_cols)}) "
                f"SELECT %s, {', '.join(shifted)} "
                "FROM runs_run WHERE sweep_id = %s ORDER BY id")
    metrics_sql = (f"INSERT INTO runs_runmetrics (run_id, {', '.join(q(c) for c in metric_cols)}) "
                   f"SELECT n.id, {', '.join('m.' + q(c) for c in metric_cols)} FROM runs_run n "
                   "JOIN runs_run o ON o.sweep_id = %s AND o.host_id = n.host_id AND o.point_key = n.point_key "
                   "JOIN runs_runmetrics m ON m.run_id = o.id WHERE n.sweep_id = %s")
    base = Sweep.objects.get(pk=template)
    out = []
    with connection.cursor() as cur:
        for at in dates:
            sweep = Sweep.objects.create(name=base.name, host_id=base.host_id, source=base.source, spec=base.spec)
            Sweep.objects.filter(pk=sweep.pk).update(created_at=at)
            shift = at - base.created_at
            cur.execute(runs_sql, [sweep.pk, *([shift] * 2), template])
            cur.execute(metrics_sql, [template, sweep.pk])
            out.append(sweep.pk)
    return out


def build_summaries() -> float:
    """`manage.py rebuild_summaries` over every sweep; returns seconds."""
    import io

    from django.core.management import call_command

    t0 = time.perf_counter()
    call_command("rebuild_summaries", stdout=io.StringIO())
    return time.perf_counter() - t0


def pages_for(ids: dict) -> list[tuple[str, str]]:
    """(name, URL) of every page measured at a level: the dashboard's pages over the shown era
    (the same content at every level; the sweep page's what-to-run fragment, which its script
    loads after it, counted as a page of its own), the same pages over two "widest" nights (3 240 runs each)
    where the level has them, and the admin's lists (run list plain, filtered, searched; metrics
    list; a widest sweep's change page)."""
    from runs.models import Run

    last, prev = ids["sweeps"][-1], ids["sweeps"][-2]
    trend_q = f"?host={ids['host']}&series={ids['series']}"
    pages = [
        ("home", "/"), ("home JSON", "/home.json"),
        ("sweep", f"/sweeps/{last}/"), ("sweep JSON", f"/sweeps/{last}/data.json"),
        ("sweep: what to run", f"/sweeps/{last}/what-to-run/"),
        ("compare", f"/compare/?old={prev}&new={last}"), ("compare JSON", f"/compare/data.json?old={prev}&new={last}"),
        ("trend", f"/trend/{trend_q}"), ("trend JSON", f"/trend/data.json{trend_q}"),
    ]
    if ids.get("widest"):
        wprev, wlast = ids["widest"]
        pages += [
            ("sweep, 3 240 runs", f"/sweeps/{wlast}/"), ("sweep JSON, 3 240 runs", f"/sweeps/{wlast}/data.json"),
            ("sweep: what to run, 3 240 runs", f"/sweeps/{wlast}/what-to-run/"),
            ("compare, 3 240 runs", f"/compare/?old={wprev}&new={wlast}"),
            ("compare JSON, 3 240 runs", f"/compare/data.json?old={wprev}&new={wlast}"),
        ]
    key = Run.objects.filter(sweep_id=last).order_by("pk").values_list("point_key", flat=True).first()
    pages += [
        ("admin: runs", "/admin/runs/run/"),
        ("admin: runs, TP 8", "/admin/runs/run/?tp=8"),
        ("admin: runs, failed", "/admin/runs/run/?state__exact=failed"),
        ("admin: runs, search point", f"/admin/runs/run/?q={key[:10]}"),
        ("admin: runs, search model", "/admin/runs/run/?q=qwen3.5"),
        ("admin: runs, search rare", "/admin/runs/run/?q=out+of+memory"),
        ("admin: metrics", "/admin/runs/runmetrics/"),
    ]
    if ids.get("widest"):
        pages.append(("admin: sweep, 3 240 runs", f"/admin/runs/sweep/{ids['widest'][-1]}/change/"))
    return pages


def measure(ids: dict, rounds: int) -> list[list]:
    """Fetch each of `pages_for(ids)` 2 + `rounds` times (+1 counting queries) as a logged-in
    superuser; rows of [page, p50 ms, p95 ms, web CPU p50 ms, bytes, queries, within budget]."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    # as a served process is (benchsite/wsgi.py): the loaded site, then what is alive now, frozen
    # out of the garbage collector's reach; what each request allocates is collected as usual
    from benchsite.wsgi import freeze_startup_heap

    user = get_user_model().objects.filter(username="bench").first()
    if user is None:
        user = get_user_model().objects.create_superuser("bench", "bench@example.org", "bench-password")
    pages = pages_for(ids)
    client = Client()
    client.force_login(user)
    freeze_startup_heap()
    out = []
    for name, url in pages:
        for _ in range(2):
            resp = client.get(url)
            assert resp.status_code == 200, (url, resp.status_code)
        times, cpu = [], []
        for _ in range(rounds):
            t0, c0 = time.perf_counter(), time.process_time()
            resp = client.get(url)
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
        with CaptureQueriesContext(connection) as q:
            client.get(url)
        p95 = pct(times, 95)
        ok = "yes" if p95 < P95_TARGET_MS and len(resp.content) < BYTES_TARGET else "NO"
        out.append([name, pct(times, 50), p95, pct(cpu, 50), len(resp.content), len(q), ok])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    ap.add_argument("--levels", default="10000,100000,1000000")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--measure-only", action="store_true",
                    help="measure the database as the last run left it (no drop, no seeding)")
    ap.add_argument("--live-too", action="store_true",
                    help="measure each level a second time without the stored summaries (pages read every run)")
    ap.add_argument("--categories", type=int, default=0, choices=range(len(CATEGORY_NAMES) + 1),
                    metavar=f"0..{len(CATEGORY_NAMES)}",
                    help="store figures for this many prompt categories on every run (issue 33: 11 = SPEED-Bench)")
    ap.add_argument("--keep-summaries", action="store_true",
                    help="with --measure-only: keep the stored summaries as they are (else rebuilt first)")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    unknown = [lv for lv in levels if lv not in LEVELS]
    if unknown:
        ap.error(f"--levels: known levels are {', '.join(map(str, LEVELS))}")
    try:
        if not args.measure_only:
            recreate_database(args.database_url)
    except Exception as exc:
        print(f"PostgreSQL at {args.database_url} is not usable: {exc}", file=sys.stderr)
        return 2
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DRAFTBOARD_VAR_DIR", "/tmp/draftboard-bench-var")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    rng = np.random.default_rng(0)
    summary = []
    if args.measure_only:
        from runs.models import RegressionFlag, Run, Sweep

        every = list(Sweep.objects.order_by("created_at", "pk").values_list("pk", flat=True))
        sweeps, older = every[-NIGHTS:], every[:-NIGHTS]
        # the two nights before the shown era, where they are "widest" ones (the 100k and 1M levels)
        widest = older[-2:] if len(older) >= 2 and Run.objects.filter(sweep_id=older[-1]).count() == 3240 else []
        levels = [Run.objects.count()]
    for level in levels:
        t0 = time.perf_counter()
        if args.measure_only:
            ids = {"sweeps": sweeps, "widest": widest, "host": "ws-pcie8", "series": "users-grid-wide",
                   "detect_ms": float("nan"), "flags": RegressionFlag.objects.count(), "runs": level}
        else:
            ids = seed(level, rng, args.categories)
        seed_s = time.perf_counter() - t0
        build_s = float("nan") if args.measure_only and args.keep_summaries else build_summaries()
        eras = "measured as stored" if args.measure_only else " then ".join(
            f"{orm + copied} nights of {18 * np.prod([len(x) for x in SHAPES[shape][:3]]) * SHAPES[shape][3]} runs"
            for shape, orm, copied in LEVELS[level])
        print(f"\n== {ids['runs']} runs: {eras}; the pages show the last {NIGHTS} "
              f"(seeded in {seed_s:.0f} s; regression detection of the last night {ids['detect_ms']:.0f} ms, "
              f"{ids['flags']} flag(s) stored over the last 4 nights; summaries built in {build_s:.1f} s)",
              flush=True)
        rows = measure(ids, args.rounds)
        print_table(["page", "p50 ms", "p95 ms", "web CPU p50 ms", "bytes", "queries", "within budget"], rows)
        summary.append((f"{ids['runs']} runs", {r[0]: r for r in rows}))
        if args.live_too:
            from runs.models import SweepSummary

            SweepSummary.objects.all().delete()
            print(f"\n-- the same {ids['runs']} runs without stored summaries (every run read, as before issue 22)")
            rows = measure(ids, args.rounds)
            print_table(["page", "p50 ms", "p95 ms", "web CPU p50 ms", "bytes", "queries", "within budget"], rows)
            summary.append((f"{ids['runs']} live", {r[0]: r for r in rows}))
            build_summaries()
    print("\n== summary: p95 ms / bytes / queries per page as runs grow; last column: p95 of the last "
          "column over the first where both have the page (goal: <= 1.5)")
    names = list(dict.fromkeys(name for _, rows in summary for name in rows))
    first, final = summary[0][1], summary[-1][1]
    print_table(["page", *[name for name, _ in summary], "p95 ratio"],
                [[name, *[f"{rows[name][2]:.1f} / {rows[name][4]} / {rows[name][5]}" if name in rows else "-"
                          for _, rows in summary],
                  f"{final[name][2] / first[name][2]:.2f}" if name in first and name in final else "-"]
                 for name in names])
    return 0


if __name__ == "__main__":
    sys.exit(main())
