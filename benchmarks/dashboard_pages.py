"""Server time, bytes and SQL queries of the sweep page, its data.json, the run page, the host
page and the admin run list, on sweeps of about 1 000 and 3 300 runs (issue 9, "Performance").

Not a test: it seeds a database once (reused on later calls; `--reseed` starts over), then
requests each page in-process through Django's test client (middleware, view, template: the
server's whole work, without a network) `--repeat` times and prints p50 / p95 ms, response bytes
and the number of SQL queries. Point DATABASE_URL at a PostgreSQL database of your own (it is
migrated; the issue's figures are PostgreSQL's):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/draftboard_dash \\
        .venv/bin/python benchmarks/dashboard_pages.py --sizes 1000 3300 --filler 100000

Seeded data, shaped like the nightly sweeps the issue measured: each sweep is the users' grid
(TP 1/4/8 x auto, linear, DDTree b15/b16/b32/b64) over 6 concurrency levels, several output
lengths and repeats (1 000 -> 972 runs, 3 300 -> 3 240 runs); 5 % of runs failed; every
succeeded run has a full metrics row with the run page's samples (4 lists of 5 000 floats, about
150 KB of JSON), a 20 KB server-log tail, argv and server environment, as real runs store.
`--filler N` adds light runs (no samples, no log tail) in 30 more sweeps until the database
holds N runs, for the admin run list at that size. The host has 54 hardware snapshots.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")
os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver,localhost,127.0.0.1")

import django  # noqa: E402

django.setup()

from _common import pct, print_table  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from benchkit.hosts.inventory import GpuInfo, HostInventory  # noqa: E402
from benchkit.hosts.topology import parse_topo_matrix  # noqa: E402
from benchkit.measure.metrics import METRIC_FIELDS  # noqa: E402
from runs.models import HardwareSnapshot, Host, Run, RunMetrics, RunState, Sweep  # noqa: E402
from runs.services.hosts import record_inventory  # noqa: E402

HOST = "bench-pcie8"
TOPO = REPO.parent / "shared" / "fixtures" / "hardware" / "pcie8-2numa" / "topo-m.txt"
UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]
GPUS_BY_TP = {1: [0], 4: [0, 1, 2, 3], 8: list(range(8))}
METHODS = [("auto", None), ("linear", None), ("ddtree", 15), ("ddtree", 16), ("ddtree", 32), ("ddtree", 64)]
CONCURRENCY = [1, 2, 4, 8, 16, 32]
#: size -> (output lengths, repeats): 18 configurations x 6 concurrency levels x these.
SHAPES = {1000: ([256, 512, 1024], 3), 3300: ([128, 256, 512, 1024, 2048], 6)}


def _gpu_refs(tp: int) -> list[dict]:
    return [{"index": i, "uuid": UUIDS[i], "pci_bus_id": f"00000000:{i + 1:02X}:00.0", "numa_node": i // 4,
             "name": "RTX PRO 6000"} for i in GPUS_BY_TP[tp]]


def _host() -> Host:
    host, created = Host.objects.get_or_create(name=HOST)
    if created or not HardwareSnapshot.objects.filter(host=host).exists():
        topo = parse_topo_matrix(TOPO.read_text())
        for n in range(54):
            gpus = [GpuInfo(index=i, uuid=UUIDS[i], pci_bus_id=f"00000000:{i + 1:02X}:00.0", name="RTX PRO 6000",
                            numa_node=i // 4, memory_total_mib=97887) for i in range(8)]
            inv = HostInventory(hostname=HOST, gpus=gpus, topology=topo, topology_source="nvidia-smi topo -m",
                                driver_version=f"580.{n // 10}", cpu_model="AMD EPYC 9354")
            record_inventory(host, inv)
    return host


def _samples(rng: np.random.Generator) -> str:
    """One run's `distributions` JSON: 4 lists of 5 000 floats (what metrics.distributions stores)."""
    return json.dumps({k: [round(float(x), 6) for x in rng.gamma(2.0, 10.0, 5000)]
                       for k in ("ttft_ms", "itl_ms", "icl_ms", "tokens_per_chunk")})


def _metric_values(rng: random.Random, tps: float, tau: float | None) -> dict:
    out = {}
    for f in METRIC_FIELDS:
        if f.kind is list:
            out[f.name] = [round(rng.random(), 4) for _ in range(15)] if tau else None
        elif f.kind is bool:
            out[f.name] = False
        elif f.kind is int:
            out[f.name] = rng.randint(50, 5000)
        elif f.group == "spec_decode" and not tau:
            out[f.name] = None
        else:
            out[f.name] = round(rng.uniform(1.0, 200.0), 4)
    out["output_throughput_tok_s"] = tps
    out["acceptance_length"] = tau
    out["error_rate"] = 0.0
    return out


def seed_sweep(host: Host, size: int, name: str, heavy: bool = True) -> Sweep:
    """A sweep of the users' grid shape with `SHAPES[size]` (see the module docstring)."""
    out_lens, repeats = SHAPES[size]
    rng, nrng = random.Random(size), np.random.default_rng(size)
    samples = [_samples(nrng) for _ in range(8)] if heavy else []
    log_tail = ("INFO 07-01 02:00:00 scheduler.py:123] Decode batch. #running-req: 8, #token: 9000, "
                "gen throughput (token/s): 1270.8, #queue-req: 0\n") * 160
    with transaction.atomic():
        sweep = Sweep.objects.create(name=name, host=host, source="benchmarks/dashboard_pages.py",
                                     spec={"name": name, "grid": {"tp": [1, 4, 8], "concurrency": CONCURRENCY}})
        runs, i = [], 0
        for tp in (1, 4, 8):
            for method, budget in METHODS:
                for conc in CONCURRENCY:
                    for out_len in out_lens:
                        for rep in range(repeats):
                            i += 1
                            spec = {"server": {"engine": "sglang", "model": "/models/Qwen3.5-27B", "method": method,
                                               "tree_budget": budget, "tp": tp, "engine_build": "sglang-ddtree-pr",
                                               "drafter": "" if method == "auto" else "/models/Qwen3.5-27B-DFlash",
                                               "extra_args": [], "env": {}},
                                    "workload": {"concurrency": conc, "output_len": out_len, "input_len": 512,
                                                 "num_prompts": 64, "dataset": "random", "seed": 0},
                                    "gpus": _gpu_refs(tp), "port": 30000, "repeat_index": rep}
                            failed = rng.random() < 0.05
                            runs.append(Run(
                                sweep=sweep, host=host, point_key=f"{name}-{i}", spec=spec, engine="sglang",
                                engine_build="sglang-ddtree-pr", engine_version="0.5.9", model="/models/Qwen3.5-27B",
                                drafter=spec["server"]["drafter"], method=method, tree_budget=budget, tp=tp,
                                gpus=_gpu_refs(tp), gpus_cross_numa=tp == 8, concurrency=conc, input_len=512,
                                output_len=out_len, num_prompts=64, repeat_index=rep,
                                state=RunState.FAILED if failed else RunState.SUCCEEDED,
                                failure_reason="error_rate_exceeded" if failed else "",
                                argv=["python", "-m", "sglang.launch_server", "--model-path", "/models/Qwen3.5-27B",
                                      "--tp-size", str(tp), "--port", "30000", "--enable-metrics"] * 3,
                                server_env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                            "CUDA_VISIBLE_DEVICES": ",".join(map(str, GPUS_BY_TP[tp]))},
                                server_log_tail=log_tail if heavy else ""))
        Run.objects.bulk_create(runs, batch_size=500)
        created = list(Run.objects.filter(sweep=sweep, state=RunState.SUCCEEDED).values_list("pk", "method", "tp",
                                                                                                 "concurrency"))
        rows = []
        for n, (pk, method, tp, conc) in enumerate(created):
            tau = None if method == "auto" else round(rng.uniform(3.0, 9.0), 3)
            tps = round(40.0 * conc * (1.0 if method == "auto" else rng.uniform(2.0, 6.5)) / (1 + tp / 8), 3)
            row = RunMetrics(run_id=pk, **_metric_values(rng, tps, tau))
            row.distributions = json.loads(samples[n % len(samples)]) if heavy else {}
            rows.append(row)
        RunMetrics.objects.bulk_create(rows, batch_size=200)
    return sweep


def seed(args) -> dict[int, Sweep]:
    call_command("migrate", verbosity=0)
    if args.reseed:
        Run.objects.all().delete()
        Sweep.objects.all().delete()
        HardwareSnapshot.objects.filter(host__name=HOST).delete()
    host = _host()
    sweeps = {}
    for size in args.sizes:
        name = f"bench-{size}"
        sweep = Sweep.objects.filter(name=name).first() or seed_sweep(host, size, name)
        sweeps[size] = sweep
    have = Run.objects.count()
    n = 0
    while have < args.filler:
        sweep = seed_sweep(host, 3300, f"bench-filler-{n}-{have}", heavy=False)
        have += sweep.runs.count()
        n += 1
    return sweeps


def measure(client: Client, url: str, repeat: int) -> tuple[list[float], int, int, int]:
    """(wall ms of each request, bytes of the last body, SQL queries of the last request, status)."""
    times, size, queries, status = [], 0, 0, 0
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as ctx:
            t0 = time.perf_counter()
            resp = client.get(url)
            body = b"".join(resp) if resp.streaming else resp.content
            times.append((time.perf_counter() - t0) * 1000)
        size, queries, status = len(body), len(ctx.captured_queries), resp.status_code
    return times, size, queries, status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 3300], choices=sorted(SHAPES))
    ap.add_argument("--repeat", type=int, default=5, help="requests per page (p50/p95 over these)")
    ap.add_argument("--filler", type=int, default=0, help="add light runs until the database holds this many")
    ap.add_argument("--reseed", action="store_true", help="delete every run and sweep first")
    ap.add_argument("--exports", action="store_true", help="also time export.csv and export.json")
    args = ap.parse_args()
    settings.ALLOWED_HOSTS = ["*"]
    t0 = time.perf_counter()
    sweeps = seed(args)
    print(f"database {connection.vendor} {settings.DATABASES['default']['NAME']}: {Run.objects.count()} runs "
          f"(seeding/reuse took {time.perf_counter() - t0:.0f} s)")
    user = get_user_model().objects.filter(username="bench").first() or get_user_model().objects.create_superuser(
        "bench", "bench@example.invalid", "bench")
    client = Client()
    client.force_login(user)
    rows = []
    for sweep in sweeps.values():
        n = sweep.runs.count()
        run = Run.objects.filter(sweep=sweep, state=RunState.SUCCEEDED, method="ddtree").order_by("id").first()
        pages = [(f"sweep page ({n} runs)", f"/sweeps/{sweep.pk}/"),
                 (f"sweep data.json ({n} runs)", f"/sweeps/{sweep.pk}/data.json"),
                 (f"run page (sweep of {n})", f"/runs/{run.pk}/")]
        if args.exports:
            pages += [(f"export.{fmt} ({n} runs)", f"/sweeps/{sweep.pk}/export.{fmt}") for fmt in ("csv", "json")]
        for label, url in pages:
            times, size_b, queries, status = measure(client, url, args.repeat)
            rows.append([label, pct(times, 50), pct(times, 95), size_b, queries, status])
    total = Run.objects.count()
    for label, url in ((f"admin run list ({total} runs)", "/admin/runs/run/"),
                       ("host page (54 snapshots)", f"/hosts/{HOST}/")):
        times, size_b, queries, status = measure(client, url, args.repeat)
        rows.append([label, pct(times, 50), pct(times, 95), size_b, queries, status])
    print_table(["page", "p50 ms", "p95 ms", "bytes", "queries", "HTTP"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
