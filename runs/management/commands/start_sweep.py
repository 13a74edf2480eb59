"""`python manage.py start_sweep sweeps/FILE.yaml [--host NAME ...] [--set key=value] [--dry-run]`: queue a
sweep, or (--dry-run) print what every run would get on each host and which preflight checks fail now,
storing nothing and starting no server. The hosts are the file's `hosts:` when it names any, else
every --host given (each runs the whole grid, on its own queue), else DRAFTBOARD_HOST.

Runs a host cannot hold (TP above its GPU count, a pinned GPU it lacks, a NUMA crossing the file
forbids) are errors located in the file (`file:line: field: host NAME: reason`): the dry run still
prints the plan of every other run, lists the refused ones and exits non-zero; without --dry-run
nothing is stored and the same errors are printed."""

from django.core.management.base import BaseCommand, CommandError

from benchkit.formats.base import Source
from benchkit.formats.errors import ResultFileError
from benchkit.formats.registry import detect
from benchkit.hosts.allocation import AllocationError
from benchkit.sweeps.dryrun import format_plan
from benchkit.sweeps.sweepfile import PointsRefused, SweepError, load_sweep_file, parse_variables
from runs.services.dispatch import BrokerUnavailable
from runs.services.hosts import HostNameError
from runs.services.sweeps import create_sweep_from_file, dry_run_sweep_file


class Command(BaseCommand):
    help = "Create a sweep from a YAML file and queue its runs on the host's Celery queue."

    def add_arguments(self, parser):
        parser.add_argument("path")
        parser.add_argument("--host", action="append", default=[],
                            help="host to run the grid on (repeatable: each host runs it on its own queue); "
                                 "the file's `hosts:` wins. Default: DRAFTBOARD_HOST")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="substitute {KEY} placeholders in the file, e.g. --set model_dir=/models/x")
        parser.add_argument("--no-enqueue", action="store_true", help="store the runs without queueing them")
        parser.add_argument("--dry-run", action="store_true",
                            help="print each run's GPUs, argv, environment and the preflight checks that fail now; "
                                 "store nothing, start no server")

    def handle(self, *args, **opts):
        try:
            subs = parse_variables(opts["set"])
            if opts["dry_run"]:
                spec = load_sweep_file(opts["path"], variables=subs or None)
                refused = []
                for name in spec.hosts or opts["host"] or [None]:
                    plan = dry_run_sweep_file(opts["path"], host_name=name, substitutions=subs or None)
                    self.stdout.write(format_plan(plan))
                    refused += plan.refused
                if refused:
                    raise PointsRefused(refused)
                return
            sweep = create_sweep_from_file(opts["path"], host_name=opts["host"] or None, substitutions=subs or None,
                                           enqueue=not opts["no_enqueue"])
        except PointsRefused as exc:
            hosts = ", ".join(dict.fromkeys(r.host for r in exc.refusals))
            n = exc.n_runs
            raise CommandError(f"{exc}\n{n} run{'s' if n != 1 else ''} refused: host {hosts} cannot hold "
                               f"{'them' if n != 1 else 'it'}; nothing was stored") from None
        except SweepError as exc:
            raise CommandError(_result_file_hint(opts["path"]) or str(exc)) from None
        except (AllocationError, HostNameError, BrokerUnavailable, ValueError) as exc:
            raise CommandError(str(exc)) from None
        queues = sorted({f"host.{name}" for name in sweep.runs.values_list("host__name", flat=True)})
        self.stdout.write(f"sweep {sweep.pk} '{sweep.name}': {sweep.runs.count()} runs "
                          f"{'stored' if opts['no_enqueue'] else 'queued on ' + ', '.join(queues)}")


def _result_file_hint(path: str) -> str | None:
    """For a sweep file that does not load: when it is a benchmark tool's result file (the format
    registry recognises it: vLLM, SGLang, GuideLLM, AIPerf, ...), the sentence that points to
    `manage.py import_results`; None otherwise (the sweep file's own error stands)."""
    try:
        _, recognition = detect(Source(path))
    except (ResultFileError, OSError):
        return None
    return (f"{path} is a {recognition.tool} result file, not a sweep file: import it with "
            f"`manage.py import_results {path}` (start_sweep runs a sweep file: name, grid, ...)")
