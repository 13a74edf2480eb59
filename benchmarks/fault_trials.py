"""Repeat the fault tests of issue 11 and print trial counts: trials, recovered, time to recover.

    .venv/bin/python benchmarks/fault_trials.py [--trials 10] [--only child,parent,...]

Each trial is one run of a test in tests/test_faults.py (a real Celery worker, real signals, a
private Redis, the synthetic engine build), in its own pytest process. A trial counts as
recovered when the test passes (the run failed with its reason, no server process left, leases
and port free, nothing lost, nothing run twice, one sweep); the time to recover is what the
test prints: from the fault (or from the worker coming back) until the run is failed and
cleaned up, or until the sweep has finished. Figures depend on the machine's load; read the
spread. Like the other scripts here it never fails on a figure (exit 0 after printing).
The kind `disk-full` (issue 35) runs tests/test_disk_full.py's real full-tmpfs tests instead;
PostgreSQL faults under a real worker are benchmarks/db_fault_trials.py.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: fault -> (pytest -k expression, what the time measures)
FAULTS = {
    "child": ("test_worker_child_sigkill_mid_run", "s from SIGKILL of the pool process to failed + cleaned up"),
    "parent": ("test_worker_parent_sigkill_mid_run", "s from the worker's restart to failed + cleaned up"),
    "hard-limit": ("test_hard_time_limit_kill", "s from the hard time limit to failed + cleaned up"),
    "redis": ("test_redis_restart_mid_sweep_loses_and_repeats_nothing and sigkill]",
              "s from Redis back up to the 6-run sweep finished"),
    "redis-data-lost": ("test_redis_restart_mid_sweep_loses_and_repeats_nothing and data",
                        "s from Redis back up (empty) to the 6-run sweep finished"),
    "two-beats": ("test_two_beats_and_a_resend_make_one_sweep", "s from the beats' start to one sweep and two no-ops"),
    # issue 35: the runs folder on a real full 2 MiB tmpfs (root only; skipped, so not recovered, otherwise)
    "disk-full": ("test_real_full_tmpfs_server_exit_is_disk_full_not_server_exited or "
                  "test_real_small_tmpfs_fails_preflight_disk_full", "the run failed disk_full (no time printed)"),
}
#: fault -> the test file its tests are in (default tests/test_faults.py)
FILES = {"disk-full": "tests/test_disk_full.py"}
TIME_RE = re.compile(r"(?:recovered in|finished|settled in) ([0-9.]+) s")


def trial(expr: str, path: str = "tests/test_faults.py") -> tuple[bool, float | None, str]:
    """Run the tests `expr` of `path` once; (passed, seconds it printed, last output lines). A
    skipped test counts as not recovered."""
    env = {**os.environ, "DRAFTBOARD_VAR_DIR": tempfile.mkdtemp(prefix="fault-trial-")}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                          "-rs", path, "-k", expr], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    found = TIME_RE.search(out.stdout)
    passed = out.returncode == 0 and " skipped" not in out.stdout.splitlines()[-1]
    return passed, float(found.group(1)) if found else None, out.stdout[-1500:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--only", default=",".join(FAULTS), help=f"comma-separated, of: {', '.join(FAULTS)}")
    args = parser.parse_args()
    rows = []
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        expr, unit = FAULTS[name]
        ok, times, t0 = 0, [], time.monotonic()
        for i in range(args.trials):
            passed, seconds, tail = trial(expr, FILES.get(name, "tests/test_faults.py"))
            ok += passed
            if passed and seconds is not None:
                times.append(seconds)
            print(f"{name} trial {i + 1}/{args.trials}: {'recovered' if passed else 'NOT RECOVERED'}"
                  f"{f' in {seconds:.1f} s' if seconds is not None else ''}", flush=True)
            if not passed:
                print(tail, flush=True)
        rows.append((name, args.trials, ok, times, unit, time.monotonic() - t0))
    print()
    print(f"{'fault':<16} {'trials':>6} {'recovered':>9} {'min':>6} {'median':>6} {'max':>6}  time to recover")
    for name, n, ok, times, unit, _ in rows:
        stats = (f"{min(times):6.1f} {statistics.median(times):6.1f} {max(times):6.1f}" if times
                 else f"{'-':>6} {'-':>6} {'-':>6}")
        print(f"{name:<16} {n:>6} {ok:>9} {stats}  {unit}")


if __name__ == "__main__":
    main()
