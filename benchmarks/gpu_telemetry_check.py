"""GPU telemetry check on a real NVIDIA host (issue 12): sample a real CUDA load through the real
sampler, print per-GPU power, clocks and energy (idle vs loaded), check the validity verdicts on a
clean window and on a window with a foreign process, and measure what sampling costs the load
client. A check, not a test: it prints figures and whether each expectation held; exit 0 (2 when
a phase could not run).

Phase 1, load (about 60 s): one child process per GPU (`torch`, bf16 8192 x 8192 matrix products
in a loop) in ONE process group, the run's stand-in; plus one "foreign" child in a group of its
own on the first GPU. `benchkit.hosts.telemetry.TelemetrySampler` (its child process, the real
NVML, `--hz`, default 10) samples every GPU from before the load starts to after it ends:
- idle window: `--idle-s` (3 s) with the children started but no CUDA context yet;
- loaded window: from 2 s after every load child has warmed up (NVML's power reading is a 1 s
  average) for `--load-s` (20 s);
- foreign window: then the foreign child runs on GPU 0 for `--foreign-s` (5 s) beside the load.
Printed per GPU: mean / peak power (W), energy from the counter and from integrated power (J)
and their ratio, SM clock (MHz, min / median / max), memory clock, utilisation, temperature,
clock-event reasons seen (nvml.h names), matrix-product TFLOP/s; the verdicts of both windows
(expected: none on the loaded window, `gpu_foreign_process` on GPU 0 in the foreign window);
the sampler's own cost (query time per tick, tick spacing, CPU time).

Phase 2, overhead (about 40 s): the load client (`benchkit.measure.loadgen`, asyncio, pinned to
one core) against `tests/synthetic_server.py` (its own process, pinned to another core; one
token per message on a fixed schedule, so the true gap is known), at `--rate` tok/s with
`--concurrency` streams; timing error = measured gap between token-carrying messages minus the
configured gap (ms, p50 / p99), for: no sampler; a sampler thread in the client's process (it
shares the GIL and, created by the pinned thread, the client's core); the sampler process on
other cores (how the runner runs it); the sampler process pinned to the client's core (worst
case). Rounds interleave the configurations. Needs aiohttp (installed on the GPU machine); if
it cannot run, the script says so and goes on.

Outputs (`$OUT`, else `--out DIR`): `gpu_telemetry.bin` (the raw encoded sample stream, as the
sampler wrote it: keep it as a fixture), `gpu_telemetry.json` (the stream in `to_dict()` layout,
the windows, per-GPU figures, verdicts, worker results and overhead figures).

On the GPU machine (Python 3.12, torch and nvidia-ml-py there; no Django, no vLLM):

    python3 benchmarks/gpu_telemetry_check.py            # OUT set by the device tool

Without a GPU (checks the script itself; no CUDA load; the stand-in NVML replays a fixture):

    .venv/bin/python benchmarks/gpu_telemetry_check.py --stand-in tests/fixtures/telemetry/clean.json --out /tmp/x
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
from _common import fmt, pct, print_table, ratio  # noqa: E402

from benchkit.hosts.nvml import load_pynvml, nvml_error_text, nvml_str  # noqa: E402
from benchkit.hosts.telemetry import TelemetryError, TelemetrySampler, ThreadSampler  # noqa: E402
from benchkit.measure.efficiency import gpu_energy  # noqa: E402
from benchkit.measure.gpu_samples import TelemetryStream, decode_telemetry  # noqa: E402
from benchkit.measure.gpu_validity import bit_names, check_gpu_window  # noqa: E402

WORKER = textwrap.dedent("""
    import json, os, sys, time
    role, folder, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])

    def touch(name, text=""):
        tmp = os.path.join(folder, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(folder, name))

    import torch
    touch(role + ".imported", str(os.getpid()))
    go = os.path.join(folder, "go." + role.split("-")[0])
    while not os.path.exists(go):
        time.sleep(0.05)
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        c = a @ b
    torch.cuda.synchronize()
    warm = time.perf_counter_ns()
    touch(role + ".warm", str(warm))
    iters, end_by, stop = 0, time.monotonic() + seconds, os.path.join(folder, "stop")
    while time.monotonic() < end_by and not os.path.exists(stop):
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
        iters += 20
    end = time.perf_counter_ns()
    tflops = 2 * n ** 3 * iters / ((end - warm) / 1e9) / 1e12
    touch(role + ".done", json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "warm_ns": warm,
                                      "end_ns": end, "iters": iters, "tflops": tflops}))
""")


def out_dir(arg: str) -> Path:
    """$OUT, else --out; SystemExit naming both when neither is set."""
    path = os.environ.get("OUT") or arg
    if not path:
        raise SystemExit("set OUT or pass --out DIR")
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p


def wait_files(folder: Path, names: list[str], timeout_s: float, procs: list[subprocess.Popen]) -> None:
    """Wait until every file exists; RuntimeError on timeout or when a child died first."""
    deadline = time.monotonic() + timeout_s
    while not all((folder / n).exists() for n in names):
        dead = [p.args[2] for p in procs if p.poll() not in (None, 0)]
        if dead:
            raise RuntimeError(f"worker(s) {dead} exited early (see {folder}/*.log)")
        if time.monotonic() > deadline:
            missing = [n for n in names if not (folder / n).exists()]
            raise RuntimeError(f"{missing} not written within {timeout_s:g} s (see {folder}/*.log)")
        time.sleep(0.05)


def gpu_list(selection: str) -> list[dict]:
    """[{index, uuid, name, power_limit_w}] of the GPUs NVML sees (or those in `selection`)."""
    nv = load_pynvml()
    nv.nvmlInit()
    try:
        print(f"driver {nvml_str(nv.nvmlSystemGetDriverVersion())}, {nv.nvmlDeviceGetCount()} GPU(s)")
        wanted = [int(x) for x in selection.split(",")] if selection else range(nv.nvmlDeviceGetCount())
        out = []
        for i in wanted:
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                limit = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
            except Exception as exc:  # noqa: BLE001
                limit = nvml_error_text(exc)
            out.append({"index": i, "uuid": nvml_str(nv.nvmlDeviceGetUUID(h)),
                        "name": nvml_str(nv.nvmlDeviceGetName(h)), "power_limit_w": limit})
        return out
    finally:
        nv.nvmlShutdown()


def window_table(stream: TelemetryStream, windows: dict[str, tuple[int, int]], workers: dict) -> list[dict]:
    """Print one table per window; return the per-GPU figures as dicts."""
    rows_out = []
    for wname, (a, b) in windows.items():
        print(f"\n{wname} window: {(b - a) / 1e9:.2f} s")
        rows = []
        for g in stream.gpus:
            e = gpu_energy(stream, g, a, b)
            ticks = stream.ticks_between(a, b)
            sm = [g.values["sm_mhz"][i] for i in ticks if g.values["sm_mhz"][i] is not None]
            mem = [g.values["mem_mhz"][i] for i in ticks if g.values["mem_mhz"][i] is not None]
            counter = e.energy_j if e.energy_source == "counter" else None
            w = workers.get(f"load-{stream.gpus.index(g)}") if wname != "idle" else None
            rows.append([f"GPU {g.index}", e.mean_power_w, e.peak_power_w, counter, e.integrated_energy_j,
                         ratio(counter, e.integrated_energy_j), min(sm) if sm else None,
                         float(np.median(sm)) if sm else None, max(sm) if sm else None,
                         float(np.median(mem)) if mem else None, e.util_gpu_mean_pct, e.temp_max_c,
                         bit_names(e.clock_events_seen), w["tflops"] if w else None])
            rows_out.append({"window": wname, **e.__dict__,
                             "sm_mhz_min": min(sm) if sm else None, "sm_mhz_max": max(sm) if sm else None})
        print_table(["GPU", "mean W", "peak W", "counter J", "power-integral J", "counter/integral", "SM min",
                     "SM median", "SM max", "mem MHz", "util %", "max C", "clock events seen", "TFLOP/s"], rows)
    return rows_out


def load_phase(args, out: Path, report: dict) -> bool:
    """Phase 1 on real GPUs. Returns True when it ran to the end."""
    gpus = gpu_list(args.gpus)
    report["gpus"] = gpus
    for g in gpus:
        print(f"  GPU {g['index']}: {g['name']} {g['uuid']} power limit {g['power_limit_w']} W")
    work = Path(tempfile.mkdtemp(prefix="telemetry-check-"))
    script = work / "worker.py"
    script.write_text(WORKER)
    procs: list[subprocess.Popen] = []
    groups: list[int] = []

    def spawn(role: str, uuid: str, group: int) -> subprocess.Popen:
        env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=uuid, PYTHONUNBUFFERED="1")
        with open(work / f"{role}.log", "wb") as log:
            p = subprocess.Popen([sys.executable, str(script), role, str(work), "300"], env=env,
                                 stdout=log, stderr=subprocess.STDOUT, process_group=group)
        procs.append(p)
        return p

    raw = out / "gpu_telemetry.bin"
    sampler = None
    try:
        first = spawn("load-0", gpus[0]["uuid"], 0)  # leader of the run's process group
        group = first.pid
        groups.append(group)
        for k, g in enumerate(gpus[1:], start=1):
            spawn(f"load-{k}", g["uuid"], group)
        foreign = spawn("foreign-0", gpus[0]["uuid"], 0)  # a group of its own
        groups.append(foreign.pid)
        roles = [f"load-{k}" for k in range(len(gpus))]
        wait_files(work, [f"{r}.imported" for r in roles + ["foreign-0"]], 180, procs)
        print(f"\nworkers imported torch; run's process group {group}, foreign pid {foreign.pid}")
        sampler = TelemetrySampler([g["uuid"] for g in gpus], raw, hz=args.hz, group_pgid=group)
        t_first = sampler.start()
        time.sleep(args.idle_s)
        idle = (t_first + 500_000_000, time.perf_counter_ns())
        (work / "go.load").touch()
        wait_files(work, [f"{r}.warm" for r in roles], 180, procs)
        warm = max(int((work / f"{r}.warm").read_text()) for r in roles)
        time.sleep(2.0 + args.load_s)
        loaded = (warm + 2_000_000_000, warm + 2_000_000_000 + round(args.load_s * 1e9))
        (work / "go.foreign").touch()
        wait_files(work, ["foreign-0.warm"], 180, procs)
        f_warm = int((work / "foreign-0.warm").read_text())
        time.sleep(args.foreign_s)
        foreign_w = (f_warm, time.perf_counter_ns())
        (work / "stop").touch()
        wait_files(work, [f"{r}.done" for r in roles + ["foreign-0"]], 60, procs)
        time.sleep(1.0)
        stream = sampler.stop()
    except (RuntimeError, TelemetryError) as exc:
        print(f"\nLOAD PHASE ABORTED: {exc}")
        return False
    finally:
        if sampler is not None:
            sampler.kill()
        for pg in groups:
            try:
                os.killpg(pg, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait(30)
    workers = {r: json.loads((work / f"{r}.done").read_text()) for r in roles + ["foreign-0"]}
    assert decode_telemetry(raw.read_bytes()) == stream
    windows = {"idle": idle, "loaded": loaded, "foreign": foreign_w}
    figures = window_table(stream, windows, workers)
    clean = check_gpu_window(stream, *loaded)
    dirty = check_gpu_window(stream, *foreign_w)
    print("\nverdicts, loaded window:", clean.messages() or "none", "| notes:", clean.notes or "none")
    print("verdicts, foreign window:", dirty.messages() or "none", "| notes:", dirty.notes or "none")
    cost(stream)
    by_w = {(f["window"], f["uuid"]): f for f in figures}
    idle_w = [by_w[("idle", g.uuid)]["mean_power_w"] for g in stream.gpus]
    load_w = [by_w[("loaded", g.uuid)]["mean_power_w"] for g in stream.gpus]
    ratios = [ratio(by_w[("loaded", g.uuid)]["energy_j"] if by_w[("loaded", g.uuid)]["energy_source"] == "counter"
                    else None, by_w[("loaded", g.uuid)]["integrated_energy_j"]) for g in stream.gpus]
    foreign_found = any(v.code == "gpu_foreign_process" and v.detail.get("pid") == workers["foreign-0"]["pid"]
                        and v.gpu_uuid == gpus[0]["uuid"] for v in dirty.verdicts)
    expect = {
        "loaded power exceeds idle by >= 300 W on every GPU": all(
            i is not None and w is not None and w - i >= 300 for i, w in zip(idle_w, load_w, strict=True)),
        "energy counter within 5 % of integrated power (loaded)": all(r is not None and abs(r - 1) <= 0.05
                                                                      for r in ratios),
        "loaded window has no verdict": not clean.verdicts,
        "foreign process found on GPU 0 in the foreign window": foreign_found,
    }
    print("\nexpectations:")
    for k, v in expect.items():
        print(f"  {'HELD' if v else 'NOT HELD'}: {k}")
    report.update({"windows_ns": windows, "figures": figures, "workers": workers, "expectations": expect,
                   "verdicts": {"loaded": clean.to_dict(), "foreign": dirty.to_dict()}, "stream": stream.to_dict(),
                   "raw_file": raw.name, "raw_bytes": raw.stat().st_size})
    print(f"\nraw stream: {raw} ({raw.stat().st_size} bytes, {stream.n_ticks} ticks x {len(stream.gpus)} GPUs)")
    shutil.rmtree(work, ignore_errors=True)
    return True


def cost(stream: TelemetryStream) -> dict:
    """Print and return the sampler's own cost: query time per tick, tick spacing, CPU share."""
    q = np.array(stream.query_ns) / 1e6
    gaps = np.diff(stream.t_ns) / 1e6
    span_s = (stream.t_ns[-1] - stream.t_ns[0]) / 1e9 if stream.n_ticks > 1 else 0.0
    cpu = stream.sampler_cpu_ns / 1e9 if stream.sampler_cpu_ns is not None else None
    c = {"ticks": stream.n_ticks, "gpus": len(stream.gpus), "query_ms_p50": pct(q, 50), "query_ms_p99": pct(q, 99),
         "query_ms_max": float(q.max()) if q.size else None, "tick_gap_ms_p50": pct(gaps, 50),
         "tick_gap_ms_p99": pct(gaps, 99), "tick_gap_ms_max": float(gaps.max()) if gaps.size else None,
         "sampler_cpu_s": cpu, "sampler_cpu_pct_of_core": 100 * cpu / span_s if cpu and span_s else None}
    print(f"\nsampler cost ({stream.sampler}, {stream.hz:g} Hz, {len(stream.gpus)} GPUs, {stream.n_ticks} ticks): "
          f"queries per tick p50 {fmt(c['query_ms_p50'])} ms, p99 {fmt(c['query_ms_p99'])} ms, max "
          f"{fmt(c['query_ms_max'])} ms; tick spacing p50 {fmt(c['tick_gap_ms_p50'])} ms, p99 "
          f"{fmt(c['tick_gap_ms_p99'])} ms, max {fmt(c['tick_gap_ms_max'])} ms; CPU {fmt(c['sampler_cpu_s'])} s = "
          f"{fmt(c['sampler_cpu_pct_of_core'], 2)} % of one core")
    return c


# ---------------------------------------------------------------------------------------------
# Phase 2: overhead on the load client


def _serve(core: int, gap_ms: float, conn, stop) -> None:
    """Child process: a synthetic server pinned to `core`; sends its URL, waits for `stop`."""
    os.sched_setaffinity(0, {core})
    sys.path.insert(0, str(REPO))
    from tests.synthetic_server import SyntheticConfig, SyntheticServer

    server = SyntheticServer(SyntheticConfig(ttft_ms=5.0, gap_ms=gap_ms, tokens_per_message=1, model="synthetic"))
    conn.send(server.start())
    stop.wait()
    server.stop()


def gap_errors_ms(logs, gap_ms: float) -> list[float]:
    """Measured minus configured gap (ms) between consecutive token-carrying messages of the
    measured requests that succeeded (from the raw logs, as MEASUREMENT.md's ICL)."""
    out = []
    for log in logs:
        if log.warmup or not log.ok:
            continue
        t = [e.t_ns for e in log.events if e.tokens > 0]
        out += [(b - a) / 1e6 - gap_ms for a, b in zip(t, t[1:], strict=False)]
    return out


def overhead_phase(args, uuids: list[str], report: dict) -> bool:
    """Phase 2. Returns True when it ran."""
    try:
        from benchkit.measure.loadgen import run_load_sync
        from benchkit.measure.workloads import build_prompts
        from benchkit.specs import WorkloadSpec
    except ImportError as exc:
        print(f"\nOVERHEAD PHASE SKIPPED: the load client cannot be imported here ({exc})")
        return False
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        print(f"\nOVERHEAD PHASE SKIPPED: needs two cores, has {cores}")
        return False
    client_core, server_core = cores[0], cores[-1]
    others = set(cores) - {client_core, server_core} or {server_core}
    gap_ms = args.concurrency * 1000.0 / args.rate
    workload = WorkloadSpec(dataset="random", input_len=16, output_len=args.output_len, num_prompts=args.num_prompts,
                            concurrency=args.concurrency, ignore_eos=True)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    stop = ctx.Event()
    server = ctx.Process(target=_serve, args=(server_core, gap_ms, child, stop), daemon=True)
    server.start()
    if not parent.poll(60):
        server.kill()
        print("\nOVERHEAD PHASE SKIPPED: the synthetic server did not start in 60 s")
        return False
    url = parent.recv()
    main_affinity = os.sched_getaffinity(0)
    configs = ["none", "thread", "process", "process_same_core"]
    results: dict[str, list[dict]] = {c: [] for c in configs}
    print(f"\noverhead: client on core {client_core}, synthetic server on core {server_core}; {args.concurrency} "
          f"streams x {args.output_len} tokens, {args.num_prompts} requests, configured {args.rate:g} tok/s "
          f"(gap {gap_ms:.3f} ms); sampler at {args.overhead_hz:g} Hz on {len(uuids)} GPU(s)")
    tmp = Path(tempfile.mkdtemp(prefix="telemetry-overhead-"))
    try:
        prompts = build_prompts(workload, base_url=url, model="synthetic")
        for rnd in range(args.rounds):
            order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
            for cfg in order:
                sampler: TelemetrySampler | ThreadSampler | None = None
                if cfg.startswith("process"):
                    sampler = TelemetrySampler(uuids, tmp / f"{cfg}-{rnd}.bin", hz=args.overhead_hz,
                                               nvml_factory=args.nvml_factory, nvml_arg=args.nvml_arg)
                    sampler.start()
                    os.sched_setaffinity(sampler.proc.pid, {client_core} if cfg == "process_same_core" else others)
                os.sched_setaffinity(0, {client_core})
                if cfg == "thread":
                    nv = _nvml(args)
                    sampler = ThreadSampler(nv, uuids, hz=args.overhead_hz)
                    sampler.start()
                try:
                    res = run_load_sync(url, "synthetic", workload, prompts=prompts, request_timeout_s=120)
                finally:
                    os.sched_setaffinity(0, main_affinity)
                    stream = sampler.stop() if sampler is not None else None
                measured = [lg for lg in res.logs if not lg.warmup]
                tokens = sum(lg.completion_tokens or 0 for lg in measured if lg.ok)
                window_s = (res.window_end_ns - res.window_start_ns) / 1e9
                errs = gap_errors_ms(res.logs, gap_ms)
                results[cfg].append({"tok_s": tokens / window_s if window_s > 0 else None, "errors": errs,
                                     "failed": sum(1 for lg in measured if not lg.ok),
                                     "ticks": stream.n_ticks if stream else None,
                                     "query_ms_p50": pct(np.array(stream.query_ns) / 1e6, 50) if stream else None})
                print(f"  round {rnd} {cfg:18s}: {results[cfg][-1]['tok_s']:8.1f} tok/s, gap error p50 "
                      f"{fmt(pct(errs, 50))} ms, p99 {fmt(pct(errs, 99))} ms"
                      + (f", {stream.n_ticks} ticks" if stream else ""))
    except Exception as exc:  # noqa: BLE001 - a benchmark: report and go on
        print(f"\nOVERHEAD PHASE ABORTED: {type(exc).__name__}: {exc}")
        return False
    finally:
        stop.set()
        server.join(10)
        if server.is_alive():
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    base = [e for r in results["none"] for e in r["errors"]]
    rows, summary = [], {}
    for cfg in configs:
        errs = [e for r in results[cfg] for e in r["errors"]]
        tok = [r["tok_s"] for r in results[cfg] if r["tok_s"]]
        summary[cfg] = {"tok_s_mean": float(np.mean(tok)) if tok else None, "err_ms_p50": pct(errs, 50),
                        "err_ms_p99": pct(errs, 99), "err_ms_p999": pct(errs, 99.9), "samples": len(errs),
                        "failed": sum(r["failed"] for r in results[cfg])}
        s = summary[cfg]
        rows.append([cfg, s["tok_s_mean"], s["err_ms_p50"], s["err_ms_p99"], s["err_ms_p999"],
                     ratio(s["err_ms_p99"], pct(base, 99)), s["samples"], s["failed"]])
    print()
    print_table(["sampler", "tok/s", "err p50 ms", "err p99 ms", "err p99.9 ms", "p99 / none", "gaps", "failed"], rows)
    report["overhead"] = {"rate_tok_s": args.rate, "gap_ms": gap_ms, "concurrency": args.concurrency,
                          "hz": args.overhead_hz, "gpus": len(uuids), "rounds": args.rounds, "summary": summary}
    return True


def _nvml(args):
    """An initialised NVML for the in-process thread sampler: pynvml, or the stand-in."""
    from benchkit.hosts.telemetry import load_nvml

    nv = load_nvml(args.nvml_factory, args.nvml_arg)
    nv.nvmlInit()
    return nv


def stand_in_phase(args, out: Path, report: dict) -> list[str]:
    """Without a GPU: sample the stand-in through the real child process for 2 s and print the
    sampler's cost; returns the stand-in's UUIDs."""
    doc = json.loads(Path(args.stand_in).read_text())
    uuids = [g["uuid"] for g in doc["gpus"]]
    raw = out / "gpu_telemetry.bin"
    with TelemetrySampler(uuids, raw, hz=args.hz, nvml_factory=args.nvml_factory, nvml_arg=args.nvml_arg) as s:
        s.start()
        time.sleep(2.0)
        stream = s.stop()
    print(f"stand-in NVML ({args.stand_in}): {stream.n_ticks} ticks of {len(uuids)} GPU(s)")
    report["stream"] = stream.to_dict()
    report["sampler_cost"] = cost(stream)
    return uuids


def main(argv: list[str] | None = None) -> int:
    """Run the phases, print the figures, write the files; return the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="", help="output folder when $OUT is not set")
    ap.add_argument("--gpus", default="", help="NVML indices, comma list (default: all)")
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--load-s", type=float, default=20.0)
    ap.add_argument("--foreign-s", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=10000.0, help="overhead phase: configured tok/s")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--overhead-hz", type=float, default=None, help="sampler rate in the overhead phase (--hz)")
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--stand-in", default="", help="no GPU: replay this TelemetryStream JSON through a stand-in NVML")
    args = ap.parse_args(argv)
    args.overhead_hz = args.overhead_hz or args.hz
    args.nvml_factory = "tests.nvml_series:SeriesNvml.from_file" if args.stand_in else ""
    args.nvml_arg = str(Path(args.stand_in).resolve()) if args.stand_in else ""
    out = out_dir(args.out)
    t0 = time.monotonic()
    report: dict = {"argv": sys.argv[1:], "python": sys.version.split()[0], "hz": args.hz}
    status = 0
    if args.stand_in:
        uuids = stand_in_phase(args, out, report)
    else:
        try:
            uuids = [g["uuid"] for g in gpu_list(args.gpus)]
        except Exception as exc:  # noqa: BLE001
            print(f"no NVML / GPU here ({nvml_error_text(exc)}): run on a GPU host, or pass --stand-in FILE")
            return 2
        if not args.skip_load and not load_phase(args, out, report):
            status = 2
    if not args.skip_overhead and not overhead_phase(args, uuids, report):
        status = 2
    (out / "gpu_telemetry.json").write_text(json.dumps(report, default=str))
    print(f"\nwrote {out / 'gpu_telemetry.json'} and {out / 'gpu_telemetry.bin'}; {time.monotonic() - t0:.0f} s in all")
    return status


if __name__ == "__main__":
    sys.exit(main())
