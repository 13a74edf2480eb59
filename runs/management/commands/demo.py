"""`python manage.py demo`: the main job on its embedded default, end to end.

Migrates, makes an admin login, starts (or reuses) Redis, the web server, a Celery worker
for this host and Celery beat, records this host's hardware inventory, builds the demo
models, queues the demo sweep (sweeps/demo.yaml) on the real vLLM CPU server, shows a
progress bar while the runs execute, prints what was measured, the dashboard URL, the path of
the sweep's PDF report (`manage.py report`) and how to log in. Running it again reuses what
exists and adds a new sweep. When no run of the sweep succeeded it exits non-zero, naming each
failure reason, how many runs it took, and what to do.
"""

from __future__ import annotations

import io
import secrets
import statistics
import time
from collections import Counter
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from benchkit.compare import categories, verdicts
from benchkit.compare.speedups import AUTO, DECODE, END_TO_END, Ratio, compute_speedups
from benchkit.engines.demo_models import build_demo_models, read_marker
from benchkit.engines.demo_prompts import CATEGORIES as DEMO_CATEGORIES
from benchkit.engines.demo_prompts import write_demo_dataset
from runs import localstack, selectors
from runs.models import LosslessCheck, Sweep
from runs.services import lossless, sweeps
from runs.services.hosts import get_or_create_host, record_inventory

#: What a user can do about a failure reason (codes from benchkit.hosts.preflight and
#: benchkit.execution.runner); anything else: read the run page.
WHAT_TO_DO = {
    "port_in_use": "another program listens on the sweep file's pinned port: stop it, or remove `port:` from "
                   "the sweep file so that free ports are chosen when each server starts",
    "model_missing": "the model or drafter directory is gone: rebuild the demo models (delete "
                     "DRAFTBOARD_MODELS_DIR and run again) or fix the paths in the sweep file",
    "model_incomplete": "the model directory lacks files: delete it and run again to rebuild it",
    "engine_env_error": "the engine build's interpreter, launcher or image is missing or cannot find the "
                        "engine: install vLLM (`make venv`) or fix `python:` / `launcher:` of the build",
    "host_env_error": "a host fault (CUDA, NVML or device nodes): check the host, then run again",
    "gpu_busy": "another process holds the GPUs: stop it, then run again",
    "host_quarantined": "an earlier run left processes behind: stop them, then clear the quarantine in the admin",
    "server_exited": "the server stopped before it was ready: its log tail is on the run page",
    "server_not_ready": "the server did not answer in time: raise limits.ready_timeout_s, or read its log tail "
                        "on the run page",
    "config_error": "the sweep cannot become a command line: fix the sweep or flags file as the message says",
}


#: Prompts written per category of the demo's dataset (sweeps/demo.yaml samples 6 of each; the
#: warmup requests take two of the rest).
DEMO_PROMPTS_PER_CATEGORY = 8


class Command(BaseCommand):
    help = "Run the demo sweep on the CPU vLLM server through Celery and print the dashboard URL."

    def add_arguments(self, parser):
        parser.add_argument("--sweep-file", default=str(Path(settings.BASE_DIR) / "sweeps" / "demo.yaml"))
        parser.add_argument("--web", default="127.0.0.1:8765", help="address:port of the dashboard")
        parser.add_argument("--timeout", type=float, default=3600, help="give up waiting after this many seconds")
        parser.add_argument("--no-wait", action="store_true", help="queue the sweep and return")

    def handle(self, *args, **opts):
        var = Path(settings.VAR_DIR)
        out = self.stdout
        call_command("migrate", interactive=False, verbosity=0)
        password = self._admin_password(var)
        host = get_or_create_host()
        snap = record_inventory(host)
        out.write(f"host {host.name}: {snap.gpu_count} GPU(s) {snap.gpu_name or '(CPU only)'}")
        models_dir = Path(settings.DRAFTBOARD_MODELS_DIR)
        t0 = time.monotonic()
        demo = build_demo_models(models_dir)
        report = read_marker(models_dir).get("report", {})
        out.write(f"demo models (trained locally; {time.monotonic() - t0:.0f} s) in {models_dir}: target loss "
                  f"{report.get('target_loss', float('nan')):.2f} nats/token, draft agrees with the target's "
                  f"greedy token at {100 * report.get('greedy_agreement', float('nan')):.0f} % of held-out positions")
        try:
            broker = localstack.ensure_redis(settings.CELERY_BROKER_URL, var)
        except localstack.LocalStackError as exc:
            raise CommandError(str(exc)) from None
        out.write(f"broker {broker}")
        for name, argv in localstack.service_argvs(host.name, opts["web"], var).items():
            pid, started = localstack.ensure_process(name, argv, var, cwd=Path(settings.BASE_DIR))
            out.write(f"{name}: pid {pid} ({'started' if started else 'already running, reused'})")
        prompts = write_demo_dataset(var / "demo" / "prompts.jsonl", per_category=DEMO_PROMPTS_PER_CATEGORY,
                                     tokenizer=demo.target)
        out.write(f"demo prompts: {prompts} ({DEMO_PROMPTS_PER_CATEGORY} each of {', '.join(DEMO_CATEGORIES)}; "
                  "real text the target never trained on)")
        sweep = sweeps.create_sweep_from_file(
            opts["sweep_file"], host_name=host.name,
            substitutions={"demo_target": str(demo.target), "demo_draft": str(demo.draft),
                           "demo_prompts": str(prompts)})
        url = f"http://{opts['web']}"
        out.write(f"sweep {sweep.pk} queued: {sweep.runs.count()} runs on queue {host.queue}")
        if not opts["no_wait"]:
            self._wait(sweep, opts["timeout"], var)
            self._await_lossless(sweep)
            self._summary(sweep)
            self._require_a_success(sweep, url, var)
        out.write("")
        out.write(f"Dashboard: {url}/sweeps/{sweep.pk}/   (all sweeps: {url}/)")
        if not opts["no_wait"]:
            out.write(f"Report:    {self._report(sweep)}   (HTML: {url}/sweeps/{sweep.pk}/report/)")
        out.write(f"Admin:     {url}/admin/   user: admin   password: {password}  (kept in {var / 'admin_password'})")
        out.write("Stop the background services with: make stop")

    def _report(self, sweep: Sweep) -> str:
        """The sweep's PDF report (`manage.py report`, by name: runs does not import analysis), or
        why it was not built."""
        buf = io.StringIO()
        try:
            call_command("report", str(sweep.pk), stdout=buf)
        except CommandError as exc:
            return f"not built: {exc}"
        return buf.getvalue().strip()

    def _admin_password(self, var: Path) -> str:
        path = var / "admin_password"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(12))
            path.chmod(0o600)
        password = path.read_text().strip()
        User = get_user_model()
        user, _ = User.objects.get_or_create(username="admin", defaults={"is_staff": True, "is_superuser": True})
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        return password

    def _wait(self, sweep: Sweep, timeout_s: float, var: Path) -> None:
        p = selectors.sweep_progress(sweep)
        deadline = time.monotonic() + timeout_s
        with tqdm(total=p["total"], unit="run", desc=f"sweep {sweep.pk}", dynamic_ncols=True) as bar:
            while True:
                p = selectors.sweep_progress(sweep)
                bar.update(p["finished"] - bar.n)
                a = p["active"]
                bar.set_postfix_str(f"run {a['id']} {a['method']} c={a['concurrency']} {a['state']} "
                                    f"{a['progress_done']}/{a['progress_total']} req" if a else
                                    f"ok {p['counts']['succeeded']} failed {p['counts']['failed']}")
                if p["finished"] >= p["total"]:
                    return
                if time.monotonic() > deadline:
                    raise CommandError(f"sweep {sweep.pk} did not finish within {timeout_s:.0f} s; "
                                       f"see {var / 'logs' / 'worker.log'}")
                time.sleep(1.0)

    def _require_a_success(self, sweep: Sweep, url: str, var: Path) -> None:
        """Raise CommandError (exit status 1) naming each failure reason, its count, an example
        message and what to do, when no run of `sweep` succeeded."""
        if selectors.state_counts(sweep)["succeeded"]:
            return
        lines = [f"no run of sweep {sweep.pk} succeeded:"]
        for reason, n, message in selectors.failure_reasons(sweep):
            lines.append(f"  {reason or 'unknown'}: {n} run(s), e.g. {message.splitlines()[0] if message else '-'}")
            lines.append(f"    what to do: {WHAT_TO_DO.get(reason, 'see the run pages and ' + str(var / 'logs'))}")
        lines.append(f"runs: {url}/sweeps/{sweep.pk}/   worker log: {var / 'logs' / 'worker.log'}")
        raise CommandError("\n".join(lines))

    def _await_lossless(self, sweep: Sweep, timeout_s: float = 60.0) -> None:
        """Wait for the worker's lossless check of `sweep` (queued when its last run finished):
        until every counted speculative run has a LosslessCheck row, at most `timeout_s`; then
        compute the check here (idempotent, runs.services.lossless.check_sweep)."""
        spec_runs = sweep.runs.counted().exclude(method=AUTO).count()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if LosslessCheck.objects.filter(run__sweep=sweep).count() >= spec_runs:
                return
            time.sleep(1.0)
        lossless.check_sweep(sweep.pk)

    def _summary(self, sweep: Sweep) -> None:
        """Print one line per configuration and concurrency: runs, median output tok/s, decode and
        end-to-end speedup over `auto` with their 95 % bootstrap intervals (>= 3 repeats), median
        tau, the median acceptance rate per draft position, and the lossless verdicts."""
        runs = list(selectors.sweep_runs(sweep))
        points = selectors.counted_points(runs)
        kept, excluded = verdicts.split_excluded(points)  # the sweep page's rule: degenerate points feed no verdict
        speedups = compute_speedups(kept, figures=(DECODE, END_TO_END))
        by_key = {(sp.label, sp.point.concurrency): sp for sp in speedups}
        groups: dict[tuple[str, int], list] = {}
        for r in runs:
            groups.setdefault((r.method_label, r.concurrency), []).append(r)
        failed = [r for r in runs if not r.counts]
        out = self.stdout
        out.write("")
        not_counted = ", ".join(f"{r.pk} ({r.state}:{r.failure_reason or '-'})" for r in failed)
        out.write(f"sweep {sweep.pk}: {len(runs) - len(failed)} of {len(runs)} runs counted"
                  + (f"; not counted: {not_counted}" if failed else ""))
        out.write("decode speedup = auto median TPOT / config median TPOT; end-to-end = output tok/s ratio; "
                  "[95% bootstrap CI over repeats]; tau = tokens per target step; acc/pos = acceptance rate per "
                  "draft position")
        rows = []
        for (label, conc), rs in groups.items():
            counted = [r for r in rs if r.counts]
            sp = by_key.get((label, conc))
            tps = [r.metrics.output_throughput_tok_s for r in counted
                   if r.metrics.output_throughput_tok_s is not None]
            taus = [r.metrics.acceptance_length for r in counted if r.metrics.acceptance_length is not None]
            pos = [r.metrics.per_position_acceptance_rate for r in counted if r.metrics.per_position_acceptance_rate]
            per_pos = " ".join(f"{statistics.median(v):.2f}" for v in zip(*pos, strict=False)) if pos else ""
            checks = Counter(getattr(getattr(r, "lossless", None), "verdict", "") or "" for r in counted)
            verdict = ("baseline" if label == AUTO else
                       ", ".join(f"{v or 'none'} {n}/{len(counted)}" for v, n in sorted(checks.items())))
            rows.append((f"{label:<16} {conc:>4} {len(counted):>4} "
                         f"{statistics.median(tps) if tps else float('nan'):>9.1f} "
                         f"{_ratio(sp.ratios[DECODE.name]) if sp else '':>20} "
                         f"{_ratio(sp.ratios[END_TO_END.name]) if sp else '':>20} "
                         f"{f'{statistics.median(taus):.2f}' if taus else '':>5}  ", per_pos, verdict))
        width = max([len("acc/pos")] + [len(r[1]) for r in rows])  # every draft position, k=8 included
        out.write(f"{'config':<16} {'conc':>4} {'runs':>4} {'out tok/s':>9} {'decode speedup':>20} "
                  f"{'end-to-end':>20} {'tau':>5}  {'acc/pos':<{width}} lossless")
        for left, per_pos, verdict in rows:
            out.write(f"{left}{per_pos:<{width}} {verdict}")
        if excluded:
            out.write(verdicts.excluded_line(points, excluded))
        by_run = {p.run_id: p for p in points}
        for conc in sorted({sp.point.concurrency for sp in speedups if sp.point.concurrency is not None}):
            fig = verdicts.figure_for("auto", conc)  # the page's default: decode at 1, end-to-end above
            for tp in sorted({sp.point.tp for sp in speedups if sp.point.concurrency == conc}):
                v = verdicts.verdict([sp for sp in speedups if (sp.point.concurrency, sp.point.tp) == (conc, tp)],
                                     fig, by_run)
                out.write(f"Verdict at TP{tp}, concurrency {conc} ({fig.title}): {v.sentence}")
        self._category_summary(sweep, kept)

    def _category_summary(self, sweep: Sweep, kept: list) -> None:
        """Print the category x configuration matrix (benchkit.compare.categories) of each TP
        degree and concurrency, the sweep page's default figure, with one sentence per category
        and what the all-prompts verdict pools; nothing for a sweep without categories."""
        by_run = selectors.category_figures(sweep.pk)
        cells: dict[tuple, list] = {}
        for p in kept:
            if p.run_id in by_run:
                cells.setdefault((p.tp, p.concurrency, p.output_len, p.temperature), []).append(p)
        out = self.stdout
        for (tp, conc, out_len, temp), ps in sorted(cells.items()):
            m = categories.category_matrix(ps, by_run, verdicts.figure_for("auto", conc))
            if m is None:
                continue
            out.write("")
            out.write(f"Per category at TP{tp}, concurrency {conc}, output {out_len}, temperature {temp:g} "
                      f"({m.figure.title} vs auto [95% CI]; tau on the category's prompts):")
            width = max(len(r.category) for r in m.rows)
            out.write(f"{'category':<{width}} {'req':>4}  " + "  ".join(f"{lab:>27}" for lab in m.labels))
            for r in m.rows:
                cells_text = []
                for c in r.cells:
                    ratio, tau = c["ratio"], c["tau"]
                    text = _ratio(ratio) if ratio is not None else "-"
                    text += ("*" if c["winner"] else "") + (f" t{tau:.2f}" if tau is not None else "")
                    cells_text.append(f"{text:>27}")
                out.write(f"{r.category:<{width}} {r.requests:>4}  " + "  ".join(cells_text))
            for r in m.rows:
                out.write(f"  {r.sentence}")
            out.write(f"  All prompts: the verdict above {m.pooled_note}.")


def _ratio(r: Ratio) -> str:
    """`1.23x [1.10-1.31]`, `1.23x` without an interval, `-` when there is no number, and
    `- (median 0)` when either side's median is 0 (a median TPOT of 0: most requests got every
    token in their first message, so there is no decode time to compare)."""
    if r.median == 0 or r.baseline_median == 0:
        return "- (median 0)"
    if r.value is None:
        return "-"
    return f"{r.value:.2f}x" + (f" [{r.ci95[0]:.2f}-{r.ci95[1]:.2f}]" if r.ci95 else "")
