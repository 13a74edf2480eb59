"""`python manage.py import_results FILE --sweep-name NAME [--method M --tp N ...]`."""

from django.core.management.base import BaseCommand, CommandError

from benchkit.formats.common import ResultFileError
from runs.services.hosts import HostNameError, get_or_create_host
from runs.services.imports import ImportOptionError, import_result_file


class Command(BaseCommand):
    help = "Import a `vllm bench serve` JSON or `sglang.bench_serving` JSONL result file as a sweep."

    def add_arguments(self, parser):
        parser.add_argument("path")
        parser.add_argument("--sweep-name", required=True)
        parser.add_argument("--host", default=None)
        parser.add_argument("--method", required=True,
                            help="decoding method that produced the file: auto, ngram, draft_model, eagle, eagle3, "
                                 "mtp, linear, ddtree")
        parser.add_argument("--num-speculative-tokens", type=int, default=None)
        parser.add_argument("--tree-budget", type=int, default=None)
        parser.add_argument("--tp", type=int, default=1)
        parser.add_argument("--engine", default=None, choices=["vllm", "sglang"],
                            help="default: the tool that wrote the file")
        parser.add_argument("--format", default="auto", choices=["auto", "vllm", "sglang"])

    def handle(self, *args, **o):
        try:
            sweep = import_result_file(o["path"], get_or_create_host(o["host"]), o["sweep_name"], method=o["method"],
                                       num_speculative_tokens=o["num_speculative_tokens"],
                                       tree_budget=o["tree_budget"], tp=o["tp"], engine=o["engine"], fmt=o["format"])
        except (ResultFileError, ImportOptionError, HostNameError, FileNotFoundError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"imported {sweep.runs.count()} run(s) into sweep {sweep.pk} '{sweep.name}'")
