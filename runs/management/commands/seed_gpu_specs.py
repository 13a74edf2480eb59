"""`python manage.py seed_gpu_specs [--file FILE] [--overwrite] [--model-config NAME=PATH ...]`: load
the GPU specification file (default benchkit/ceilings/gpu_specs.yaml) into the admin's GPU specs
table, and optionally keep models' config.json under the names runs record (docs/CEILINGS.md)."""

from django.core.management.base import BaseCommand, CommandError

from benchkit.ceilings.gpus import GpuSpecFileError
from benchkit.ceilings.modelconfig import ModelConfigError
from runs.services.ceilings import seed_gpu_specs, store_model_config


class Command(BaseCommand):
    help = ("Seed the GPU specs table (memory bandwidth, dense peak FLOP/s, sources) from a YAML file; rows already "
            "there are kept as the admin left them unless --overwrite. --model-config NAME=PATH stores a config.json "
            "for the ceilings under the model name runs record.")

    def add_arguments(self, parser):
        parser.add_argument("--file", help="GPU specification file (default: benchkit/ceilings/gpu_specs.yaml)")
        parser.add_argument("--overwrite", action="store_true", help="replace rows already in the table")
        parser.add_argument("--model-config", action="append", default=[], metavar="NAME=PATH",
                            help="store PATH (a config.json or a model directory) under model NAME (repeatable)")

    def handle(self, *args, **opts):
        try:
            created, updated, kept = seed_gpu_specs(opts["file"], overwrite=opts["overwrite"])
        except GpuSpecFileError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"GPU specs: {created} created, {updated} updated, {kept} kept as they were")
        for item in opts["model_config"]:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise CommandError(f"--model-config wants NAME=PATH, got {item!r}")
            try:
                store_model_config(name, path)
            except ModelConfigError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"model config stored for {name!r}")
