"""`python manage.py report SWEEP [--baseline auto|linear|LABEL] [--out DIR] [--format pdf|tex|html]`:
the sweep's report (analysis.report): the question and the answer, the speedup matrix, the
figures as vector graphics, what was measured on what, the runs that do not count, GPU
efficiency and the exact command lines. Prints the path of the file written."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from analysis import report
from analysis.filters import QueryError
from runs.models import Sweep


def default_out_dir(sweep_id: int) -> Path:
    """Where a report goes without --out: $DRAFTBOARD_VAR_DIR/reports/sweep-<id>/."""
    return Path(settings.VAR_DIR) / "reports" / f"sweep-{sweep_id}"


class Command(BaseCommand):
    help = ("Write a sweep's report: a PDF compiled by pdflatex (default), its TeX source with the figures as "
            "PDF files, or a self-contained HTML file. Prints the path written.")

    def add_arguments(self, parser):
        parser.add_argument("sweep", type=int, help="the sweep's id")
        parser.add_argument("--baseline", default="auto",
                            help="speedups are divided by this configuration: auto (default), linear or any "
                                 "configuration label of the sweep (b15, ngram k=4, ...)")
        parser.add_argument("--out", type=Path, help="folder to write into (default: var/reports/sweep-ID/)")
        parser.add_argument("--format", choices=report.FORMATS, default="pdf")

    def handle(self, *args, **opts):
        sweep = Sweep.objects.select_related("host").filter(pk=opts["sweep"]).first()
        if sweep is None:
            raise CommandError(f"no sweep {opts['sweep']}")
        out = opts["out"] or default_out_dir(sweep.pk)
        try:
            path = report.write_report(sweep, out, opts["format"], opts["baseline"])
        except QueryError as exc:
            raise CommandError(f"--{exc}") from None
        except report.ReportError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(path))
