"""What the back-fill commands over nightly series (`detect_regressions`, `detect_change_points`)
share: their `--sweep` / `--series` / `--host` arguments and how they are checked."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.management.base import CommandError

from runs.models import Host, Sweep


def add_series_arguments(parser, sweep_help: str, series_help: str, host_help: str) -> None:
    """`--sweep ID`, `--series NAME`, `--host NAME` on a command's argument parser."""
    parser.add_argument("--sweep", type=int, help=sweep_help)
    parser.add_argument("--series", help=series_help)
    parser.add_argument("--host", help=host_help)


@dataclass(frozen=True)
class SeriesChoice:
    """A checked choice: one sweep (`sweep_id`), or the series named `series` (None: every name)
    of the host `host_id` (None: every host)."""

    sweep_id: int | None
    series: str | None
    host_id: int | None


def series_choice(opts: dict) -> SeriesChoice:
    """The choice the options make. Raises CommandError naming a sweep or host that does not
    exist, or `--sweep` given with `--series` or `--host` (it names one sweep: they would be
    ignored)."""
    if opts["sweep"] is not None:
        if opts["series"] is not None or opts["host"] is not None:
            raise CommandError("--sweep names one sweep: give --series and --host without it")
        if not Sweep.objects.filter(pk=opts["sweep"]).exists():
            raise CommandError(f"no sweep {opts['sweep']}")
        return SeriesChoice(opts["sweep"], None, None)
    host_id = None
    if opts["host"] is not None:
        host_id = Host.objects.filter(name=opts["host"]).values_list("pk", flat=True).first()
        if host_id is None:
            raise CommandError(f"no host named {opts['host']!r}")
    return SeriesChoice(None, opts["series"], host_id)
