"""`python manage.py import_results PATH [--method M] [--name-pattern P] [--sweep-name N] ...`.

PATH is one result file (or a folder that a folder format reads), or a folder whose files are
named by `--name-pattern` (e.g. the users' `bench_results/` with `'tp{tp}-{method}.json'`),
imported into one sweep. `--format` is `auto` (the file's markers decide) or a format of the
registry (benchkit.formats.registry: its choices and help are derived from it). Prints one line
per file (imported as which tool / already imported / refused with its reason / skipped); exits
non-zero when a file was refused (the others are imported all the same).
"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from benchkit.engines.registry import launched_engines
from benchkit.formats.errors import ResultFileError, printable
from benchkit.formats.registry import FORMATS, format_choices
from benchkit.methods import METHOD_NAMES
from runs.services.hosts import HostNameError
from runs.services.imports import ImportOptionError, ImportReport, import_result_file, import_result_folder


def _alias(text: str) -> tuple[str, str]:
    token, sep, label = text.partition("=")
    if not sep or not token.strip() or not label.strip():
        raise CommandError(f"--alias {text!r}: use TOKEN=METHOD, e.g. tree15=b15")
    return token.strip(), label.strip()


class Command(BaseCommand):
    help = ("Import result files of the tools in the format registry (vllm bench serve, sglang.bench_serving, "
            "AIPerf, GuideLLM, genai-bench, inference-perf, vllm bench sweep): one file or tool folder, or a folder "
            "of result files into one sweep with --name-pattern.")

    def add_arguments(self, parser):
        parser.add_argument("path", help="a result file (or a folder that a format reads as one), or a folder of "
                                         "result files (with --name-pattern)")
        parser.add_argument("--name-pattern", default=None,
                            help="folder import: file names with tokens {tp}, {method}, {concurrency}, {output_len}, "
                                 "e.g. 'tp{tp}-{method}.json'")
        parser.add_argument("--sweep-name", default=None, help="default: the file's or folder's name")
        parser.add_argument("--into-sweep", type=int, default=None, metavar="ID",
                            help="add the runs to this existing sweep (e.g. beside draftboard's own runs of the same "
                                 "configuration) instead of a new one")
        parser.add_argument("--host", default=None)
        parser.add_argument("--method", default=None,
                            help=f"decoding method that produced the file(s): {', '.join(METHOD_NAMES)}, or a token "
                                 "such as b15 (DDTree budget 15), linear, ar; needed unless the file states each "
                                 "run's method (a vllm bench sweep folder)")
        parser.add_argument("--alias", action="append", default=[], metavar="TOKEN=METHOD",
                            help="another name for a method token, e.g. tree15=b15 (repeatable)")
        parser.add_argument("--num-speculative-tokens", type=int, default=None)
        parser.add_argument("--tree-budget", type=int, default=None)
        parser.add_argument("--tp", type=int, default=1)
        parser.add_argument("--engine", default=None, choices=launched_engines(),
                            help="default: what the file says, else the tool that wrote it")
        parser.add_argument("--format", default="auto", choices=format_choices(),
                            help="auto (the file's markers decide) or one of: "
                                 + "; ".join(f"{f.name} ({f.tool}: {f.reads})" for f in FORMATS.values()))

    def handle(self, *args, **o):
        path = Path(o["path"])
        aliases = dict(_alias(a) for a in o["alias"])
        common = dict(host=o["host"], sweep_name=o["sweep_name"], num_speculative_tokens=o["num_speculative_tokens"],
                      tree_budget=o["tree_budget"], tp=o["tp"], engine=o["engine"], fmt=o["format"], aliases=aliases,
                      into_sweep=o["into_sweep"])
        try:
            if path.is_dir() and o["name_pattern"]:
                report = import_result_folder(path, o["name_pattern"], method=o["method"], **common)
            else:  # without --method, each run's file must state its method (a vllm bench sweep folder)
                report = import_result_file(path, method=o["method"], **common)
        except ResultFileError as exc:
            hint = ("; a folder of result files, one per configuration, is imported with --name-pattern, e.g. "
                    "'tp{tp}-{method}.json'") if path.is_dir() and not o["name_pattern"] else ""
            raise CommandError(f"{exc}{hint}") from None
        except (ImportOptionError, HostNameError) as exc:
            raise CommandError(str(exc)) from None
        self._summary(report)

    def _summary(self, report: ImportReport) -> None:
        for f in report.files:
            f.path = printable(f.path)
            if f.status == "imported":
                self.stdout.write(f"imported          {f.path} ({f.tool}): {len(f.runs)} run(s) {_ids(f.runs)}")
            elif f.status == "existing":
                self.stdout.write(f"already imported  {f.path} ({f.tool}): run(s) {_ids(f.runs)} in sweep "
                                  f"{f.sweep_id} ({f.reason}); nothing stored")
            elif f.status == "skipped":
                self.stdout.write(f"skipped           {f.path}: {f.reason}")
        for f in report.of("refused"):
            self.stdout.write(f"refused           {f.reason}")
        if report.sweep is not None:
            self.stdout.write(f"imported {len(report.run_ids)} run(s) from {len(report.of('imported'))} file(s) "
                              f"into sweep {report.sweep.pk} '{report.sweep.name}'")
        refused = report.of("refused")
        if refused:
            raise CommandError(f"{len(refused)} of {len(report.files)} file(s) refused (listed above); "
                               "the others were imported")


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids)) if ids else "(none)"
