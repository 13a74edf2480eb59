"""Long fuzz run of the result-file import (issue 10): mutated real result files (the strategies
of tests/resultfuzz.py) imported through the real service into a scratch database, with counts.

    .venv/bin/python benchmarks/fuzz_imports.py [--examples 5000] [--seed 1] [--database-url URL]

Prints: examples, clean refusals (ResultFileError), imports (new runs), already imported (same
bytes seen before), tracebacks (any other exception: a bug), partial writes (a refused import
that changed a row count, or an imported run without metrics), bound violations (a stored
figure negative, non-finite or outside its schema bounds), the most common refusal reasons, and
the first tracebacks / violations in full, and the counts per seed (every format's real files:
tests/resultfuzz.py SEEDS). The goal (issues 10 and 19): tracebacks, partial writes and bound
violations (a kept-keys block over its bound included) all 0. Exit 0 after printing (a figure
never fails the script).

The database is a fresh SQLite file in a temporary folder, migrated here, unless
`--database-url` names a scratch database (it is migrated and written to: never a real one).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database-url", default=None, help="a scratch database (default: a temporary SQLite)")
    args = parser.parse_args()

    scratch = tempfile.mkdtemp(prefix="draftboard-fuzz-")
    os.environ["DRAFTBOARD_VAR_DIR"] = scratch
    if args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import OperationalError, connection
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st

    from tests.resultfuzz import METHODS, check_import, result_files, write_sample

    try:
        call_command("migrate", verbosity=0)
    except OperationalError as exc:
        print(f"fuzz_imports: cannot use the scratch database {args.database_url or '(SQLite)'}: "
              f"{str(exc).strip()}\n(create it first, e.g. `createdb -h 127.0.0.1 -U postgres NAME`)", file=sys.stderr)
        return 2
    print(f"database: {connection.vendor} ({connection.settings_dict['NAME']}); examples {args.examples}, "
          f"seed {args.seed}")

    counts: collections.Counter[str] = collections.Counter()
    by_seed: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    reasons: collections.Counter[str] = collections.Counter()
    samples: list[str] = []
    files = Path(scratch) / "files"
    files.mkdir()

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(result_files(), st.sampled_from(METHODS))
    def one(sample, method):
        counts["examples"] += 1
        name = sample.name
        folder = files / f"{counts['examples']}-{name}"
        outcome = check_import(write_sample(folder, sample), method)
        shutil.rmtree(folder)
        counts[outcome.status] += 1
        by_seed[name][outcome.status] += 1
        counts["partial writes"] += outcome.partial_write
        counts["bound violations"] += len(outcome.violations)
        if outcome.status == "refused":
            # the reason without the file, line and values: "completed: must be >= 0"
            reason = re.sub(r"^\S+?(:\d+)?: ", "", outcome.error)
            reasons[re.sub(r", got .*|\d+(\.\d+)?", "#", reason)[:90]] += 1
        if (outcome.status == "traceback" or outcome.partial_write or outcome.violations) and len(samples) < 5:
            samples.append(f"{outcome.status} {name} {method}: {outcome.violations} {outcome.error}")

    start = time.perf_counter()
    one()
    wall = time.perf_counter() - start
    print(f"\n{'examples':<24}{counts['examples']:>8}   ({wall:.0f} s, {counts['examples'] / wall:.0f} per s)")
    for label, key in (("clean refusals", "refused"), ("imports", "imported"), ("already imported", "existing"),
                       ("tracebacks", "traceback"), ("partial writes", "partial writes"),
                       ("bound violations", "bound violations")):
        print(f"{label:<24}{counts[key]:>8}")
    print(f"\n{'seed':<34}{'examples':>9}{'imported':>9}{'refused':>9}{'existing':>9}{'traceback':>10}")
    for name, c in sorted(by_seed.items()):
        print(f"{name:<34}{sum(c.values()):>9}{c['imported']:>9}{c['refused']:>9}{c['existing']:>9}"
              f"{c['traceback']:>10}")
    goal = counts["traceback"] == counts["partial writes"] == counts["bound violations"] == 0
    print(f"\ngoal (tracebacks, partial writes, bound violations all 0): {'met' if goal else 'NOT met'}")
    print("\nmost common refusals:")
    for reason, n in reasons.most_common(15):
        print(f"{n:>6}  {reason}")
    for s in samples:
        print("\n" + s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
