"""Least privilege for sweeps entered on the web (issue 11): what reaches a GPU host's command
line and environment.

A sweep's `server.env` and `server.extra_args` go verbatim into the server's environment and
argv on the GPU host, so `LD_PRELOAD`, `PYTHONPATH` or a flag that loads code would run whatever a
web user asks for. A user who is not a superuser may use only the variable names in
settings.DRAFTBOARD_SERVER_ENV_ALLOWLIST and the flags in settings.DRAFTBOARD_EXTRA_ARGS_ALLOWLIST;
a superuser may use anything, and either way what was used is written to each run's history
(runs.services.sweeps). Sweep files started from the command line or a schedule are the
operator's own files and are not filtered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

from benchkit.specs import RunSpec


class OverrideNotAllowed(PermissionError):
    """A sweep sets server environment variables or extra arguments the user may not set;
    `problems` names each one."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass
class Overrides:
    """What a sweep adds to its servers' environment and command lines, over all its runs:
    `env` (name -> value) and `extra_args` (argv tokens, in order of first use)."""

    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.env or self.extra_args)

    def describe(self) -> str:
        """One line for a run's history, e.g. `server.env {'A': '1'}; extra args ['--x', '2']`."""
        return "; ".join(part for part in (f"server.env {self.env}" if self.env else "",
                                           f"extra args {self.extra_args}" if self.extra_args else "") if part)


def overrides_of(runspecs: list[RunSpec]) -> Overrides:
    """The union of `server.env` and `server.extra_args` over `runspecs`."""
    out = Overrides()
    for spec in runspecs:
        out.env.update({str(k): str(v) for k, v in spec.server.env.items()})
        for arg in spec.server.extra_args:
            if str(arg) not in out.extra_args:
                out.extra_args.append(str(arg))
    return out


def flag_name(arg: str) -> str | None:
    """The flag an argv token names (`--x=1` -> `--x`), or None for a value (no leading '-')."""
    return arg.split("=", 1)[0] if arg.startswith("-") else None


def not_allowed(overrides: Overrides) -> list[str]:
    """Messages naming each environment variable and flag outside the settings' allowlists.

    Every token that starts with '-' must be an allowlisted flag (`--flag value` and
    `--flag=value` both count as `--flag`); other tokens are values of the flag before them."""
    env_ok = set(settings.DRAFTBOARD_SERVER_ENV_ALLOWLIST)
    args_ok = set(settings.DRAFTBOARD_EXTRA_ARGS_ALLOWLIST)
    problems = [f"server.env {name!r} is not in DRAFTBOARD_SERVER_ENV_ALLOWLIST "
                f"({', '.join(sorted(env_ok)) or 'empty'})" for name in sorted(overrides.env) if name not in env_ok]
    for arg in overrides.extra_args:
        name = flag_name(arg)
        if name is not None and name not in args_ok:
            problems.append(f"extra argument {name!r} is not in DRAFTBOARD_EXTRA_ARGS_ALLOWLIST "
                            f"({', '.join(sorted(args_ok)) or 'empty'})")
    return problems


def check_overrides(runspecs: list[RunSpec], user) -> Overrides:
    """The sweep's overrides when `user` may use them; raises OverrideNotAllowed naming each
    variable or flag outside the allowlists unless `user` is a superuser."""
    overrides = overrides_of(runspecs)
    problems = not_allowed(overrides)
    if problems and not getattr(user, "is_superuser", False):
        raise OverrideNotAllowed(problems)
    return overrides
