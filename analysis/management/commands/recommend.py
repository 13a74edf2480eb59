"""`python manage.py recommend SWEEP [--tp N] [--concurrency B] [--output-len N] [--top N]
[--write-sweep FILE]`: what to run next, from the fitted cost model over the sweep's counted runs
(analysis.recommend, docs/CEILINGS.md "The cost model"); the same ranking as the sweep page's
"what to run" panel. Fitted on one workload shape per TP (analysis.recommend: the one with the
most runs, else the longest output); `--output-len` picks another."""

import argparse
from pathlib import Path

import yaml
from django.core.management.base import BaseCommand, CommandError

from analysis import recommend
from runs import selectors
from runs.ceilings import ceiling_inputs
from runs.models import Sweep


def _positive(text: str) -> int:
    """A whole number >= 1 (argparse type); ArgumentTypeError otherwise."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


class Command(BaseCommand):
    help = ("Rank every K or tree budget by predicted decode speedup (with a 95 % interval) at a TP and "
            "concurrency, measured or not; measured points beside their prediction, marked when outside its "
            "interval. --write-sweep FILE writes a sweep file of the top unmeasured candidates.")

    def add_arguments(self, parser):
        parser.add_argument("sweep", type=int, help="sweep id")
        parser.add_argument("--tp", type=_positive, help="tensor parallel size (default: every TP of the sweep)")
        parser.add_argument("--concurrency", type=_positive, help="concurrency B (default: every measured one)")
        parser.add_argument("--output-len", type=_positive, help="fit on the runs of this output length (tokens; "
                            "default: the workload shape with the most runs, the longest output on a tie)")
        parser.add_argument("--top", type=_positive, default=3, help="candidates in --write-sweep (default 3)")
        parser.add_argument("--write-sweep", metavar="FILE", help="write a sweep file of the top candidates")

    def handle(self, *args, **opts):
        sweep = Sweep.objects.filter(pk=opts["sweep"]).first()
        if sweep is None:
            raise CommandError(f"no sweep {opts['sweep']}")
        chosen = {"output_len": [opts["output_len"]]} if opts["output_len"] is not None else {}
        points = selectors.figure_points(sweep.pk, recommend.POINT_FIELDS, None, **chosen)
        if not points:
            raise CommandError(f"sweep {sweep.pk} has no counted run"
                               + (f" of output length {opts['output_len']}" if chosen else ""))
        inputs = ceiling_inputs({p.model for p in points} | {p.drafter for p in points}, {p.host_id for p in points})
        measured_tps = sorted({p.tp for p in points})
        if opts["tp"] is not None and opts["tp"] not in measured_tps:
            raise CommandError(f"sweep {sweep.pk} has no counted run at TP {opts['tp']} "
                               f"(its TPs: {', '.join(map(str, measured_tps))})")
        tps = [opts["tp"]] if opts["tp"] is not None else measured_tps
        entries = []
        for tp in tps:
            bs = [opts["concurrency"]] if opts["concurrency"] is not None else sorted(
                {p.concurrency for p in points if p.tp == tp and p.concurrency})
            entries += [recommend.recommend_for(points, inputs, tp, b) for b in bs]
        for e in entries:
            self.stdout.write(recommend.format_entry(e) + "\n")
        if opts["write_sweep"]:
            if len(entries) != 1:
                raise CommandError("--write-sweep needs one TP and one concurrency (--tp and --concurrency)")
            if entries[0].rec is None:
                raise CommandError(f"no prediction to write: {entries[0].error}")
            try:
                spec = recommend.sweep_file_for(sweep.spec or {}, entries[0], opts["top"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            try:
                Path(opts["write_sweep"]).write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"--write-sweep {opts['write_sweep']}: {exc.strerror or exc}") from None
            self.stdout.write(f"wrote {opts['write_sweep']}: {spec['description']}")
