"""Import result sources of the tools in the format registry (benchkit.formats.registry: `vllm
bench serve` JSON, `sglang.bench_serving` JSON lines, AIPerf, GuideLLM, genai-bench,
inference-perf, `vllm bench sweep` folders): one file or folder a format reads
(`import_result_file`), or a folder of result files named by a pattern into one sweep
(`import_result_folder`).

Every source passes the validated boundary (benchkit.formats.reader.read_result_file: the format
named, or the one whose markers the source carries) before the database is touched; a source it
refuses raises (or, in a folder, is listed with) its `ResultFileError`, `file:line: field:
reason`, and stores nothing. What the file cannot say is given by the caller (decoding method,
TP) or by the file's name (`benchkit.formats.names`); a method the file states (a `vllm bench
sweep` run's serve parameters) is the run's own. Both are checked against what the file does say
(a file with acceptance figures is not `auto`; tau <= k + 1; a name's concurrency or output
length agrees with the file's).

Each import is one transaction, host creation included: a refused file leaves no row behind.
Each source is recorded once by the sha256 of the bytes read (`ResultFile`, unique;
benchkit.formats.base.Source.digest): importing it again reports its existing runs and creates
nothing. Each run becomes a RunOutcome (benchkit.execution.outcome) stored by
runs.services.outcomes.store_outcome, the writer of every finished run: a Run created in its
final state (succeeded, or failed `all_requests_failed` for a file whose every request failed) by
the move `imported -> succeeded | failed` of its history, and RunMetrics whose `source_tool` and
`definitions` record the tool's own metric definitions (their "ITL" is per chunk: draftboard
stores it as ICL); a figure or a workload value the file lacks stays NULL (unknown), and the
file's keys draftboard has no column for are kept in `extra`. This module catches only
ResultFileError (and the unique constraint's IntegrityError of a concurrent import of the same
file); anything else is a bug and propagates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from benchkit import config_record
from benchkit.engines.registry import engine_for_tool
from benchkit.execution.outcome import RunOutcome
from benchkit.formats.common import ImportedRun
from benchkit.formats.errors import ResultFileError
from benchkit.formats.limits import INT_MAX, TEXT_LIMITS
from benchkit.formats.names import NamePattern, NamePatternError
from benchkit.formats.reader import ResultFile as ReadFile
from benchkit.formats.reader import read_result_file
from benchkit.methods import METHODS, MethodChoice, MethodError, check_method, parse_method_token
from runs.models import Host, ResultFile, Run, Sweep
from runs.services import lossless
from runs.services.hosts import host_name
from runs.services.outcomes import store_outcome
from runs.services.transitions import IMPORTED

#: Most files one folder import reads (bounded work).
MAX_FOLDER_FILES = 10_000


class ImportOptionError(ValueError):
    """The options given for an import contradict each other or the method's rules."""


#: The import command's option for each field of benchkit.methods.check_method.
OPTION_NAMES = {"method": "--method", "num_speculative_tokens": "--num-speculative-tokens",
                "tree_budget": "--tree-budget", "drafter": "--drafter", "prefix_caching": "--prefix-caching"}


def resolve_method(method: str, num_speculative_tokens: int | None = None, tree_budget: int | None = None,
                   aliases: dict[str, str] | None = None) -> MethodChoice:
    """The decoding configuration of `--method` (a name, or a token of
    benchkit.methods.parse_method_token: `b15`, `linear`, `ar`, an alias) plus the explicit
    `--num-speculative-tokens` / `--tree-budget`, checked by the method table (a result file does
    not name its drafter, so that is not checked). Raises ImportOptionError naming the option."""
    try:  # a bare method name takes its k / budget from the options; a token (b15) carries them
        choice = MethodChoice(method) if method in METHODS else parse_method_token(method, aliases)
    except MethodError as exc:
        raise ImportOptionError(f"--method: {exc.reason}") from None
    for name, given, from_token in (("num_speculative_tokens", num_speculative_tokens, choice.num_speculative_tokens),
                                    ("tree_budget", tree_budget, choice.tree_budget)):
        if given is not None and from_token is not None and given != from_token:
            raise ImportOptionError(f"{OPTION_NAMES[name]} {given} contradicts --method {method!r}")
    k = num_speculative_tokens if num_speculative_tokens is not None else choice.num_speculative_tokens
    budget = tree_budget if tree_budget is not None else choice.tree_budget
    try:
        check_method(choice.method, k, budget, drafter=None, names=OPTION_NAMES)
    except MethodError as exc:
        raise ImportOptionError(f"{OPTION_NAMES[exc.field]}: {exc.reason}") from None
    return MethodChoice(choice.method, k, budget)


def check_import_options(tp: int, sweep_name: str | None) -> None:
    """Raise ImportOptionError for TP outside 1..INT_MAX or an empty / over-long sweep name."""
    if not 1 <= tp <= INT_MAX:
        raise ImportOptionError(f"--tp {tp}: must be >= 1")
    if sweep_name is not None and (not sweep_name.strip() or len(sweep_name) > 200):
        raise ImportOptionError("--sweep-name: give 1-200 characters")


@dataclass(frozen=True)
class RunChoice:
    """What the caller (or a file's name) says about a file's runs: decoding configuration (None:
    each run's own, which its file must state), TP, engine (None: the tool that wrote the file),
    and concurrency / output length from the name."""

    method: MethodChoice | None
    tp: int = 1
    engine: str | None = None
    concurrency: int | None = None
    output_len: int | None = None


@dataclass
class FileReport:
    """The outcome for one file: `status` imported (new runs), existing (imported before: its
    runs), refused (`reason`, nothing stored) or skipped (a folder file whose name does not match
    the pattern). `runs`: run ids; `sweep_id`: the sweep holding them; `tool`: the tool the file
    was read as (benchkit.formats.reader.ResultFile.tool), for imported and existing files."""

    path: str
    status: str
    runs: list[int] = field(default_factory=list)
    sweep_id: int | None = None
    reason: str = ""
    tool: str = ""


@dataclass
class ImportReport:
    """What an import did: the new sweep (None when nothing new was stored) and one FileReport per file."""

    sweep: Sweep | None
    files: list[FileReport]

    def of(self, status: str) -> list[FileReport]:
        """The files with `status`."""
        return [f for f in self.files if f.status == status]

    @property
    def run_ids(self) -> list[int]:
        """Ids of the runs this import created."""
        return [r for f in self.of("imported") for r in f.runs]


@dataclass
class _Parsed:
    file: ReadFile
    choice: RunChoice


def method_of_run(run: ImportedRun, given: MethodChoice | None) -> MethodChoice:
    """The decoding configuration of an imported run: the one its file states (a `vllm bench
    sweep` run's speculative_config), else the one given (`--method`). Raises ResultFileError at
    the run when they disagree or when neither says."""
    if run.method is None and given is None:
        raise ResultFileError(run.origin, f"the {run.source_tool} file does not say which decoding method produced "
                                          "this run: give --method (e.g. auto, linear, b15, 'draft_model k=4')")
    if run.method is not None and given is not None and not (
            run.method.method == given.method
            and given.num_speculative_tokens in (None, run.method.num_speculative_tokens)
            and given.tree_budget in (None, run.method.tree_budget)):
        raise run.refuse("method", f"the file says {run.method.label!r}, --method says {given.label!r}")
    return run.method or given


def _check_against_file(read: ReadFile, choice: RunChoice) -> None:
    """Refuse (ResultFileError at the file's field) what the file contradicts in `choice`, and a
    run whose method neither the file nor the caller gives."""
    for run in read.runs:
        method = method_of_run(run, choice.method)
        info = METHODS[method.method]
        k = method.num_speculative_tokens
        m, w = run.metrics, run.workload
        if not info.speculates and m.has_spec_decode:
            name = "acceptance_length" if m.acceptance_length is not None else next(
                f for f in ("acceptance_rate", "spec_num_drafts", "spec_num_draft_tokens", "spec_num_accepted_tokens",
                            "per_position_acceptance_rate") if getattr(m, f) is not None)
            raise run.refuse(name, f"the file records speculative decoding: the method "
                                   f"{method.label!r} does not speculate (give the method that produced it)")
        if k is not None and info.takes_k and m.acceptance_length is not None and m.acceptance_length > k + 1:
            raise run.refuse("acceptance_length", f"acceptance length {m.acceptance_length} is more than k + 1 = "
                                                  f"{k + 1} for {method.label} (tau is in [1, k + 1])")
        for name, given in (("concurrency", choice.concurrency), ("output_len", choice.output_len)):
            if given is not None and w.get(name) is not None and w[name] != given:
                raise run.refuse(name, f"{w[name]}, but the file's name says {name} {given}")


def _parse(path: Path, fmt: str, choice: RunChoice) -> _Parsed:
    read = read_result_file(path, fmt)
    _check_against_file(read, choice)
    return _Parsed(read, choice)


def _outcome(imp: ImportedRun) -> RunOutcome:
    """The RunOutcome of one imported run: succeeded, or failed with the file's failure; the
    file's figures and their source (tool, its version as definitions["tool_version"],
    definitions, keys without a column); no logs."""
    reason, message = imp.failure or ("", "")
    definitions = dict(imp.definitions)
    if imp.tool_version:
        definitions["tool_version"] = imp.tool_version
    return RunOutcome(ok=imp.failure is None, reason=reason, message=message, engine_version=imp.source_version or "",
                      metrics=imp.metrics, spec_source=imp.spec_source or "", source_tool=imp.source_tool,
                      definitions=definitions, extra=imp.source_extra)


#: The Run columns an imported file's workload gives (benchkit.config_record: `run_column` and
#: `imported`); the choice (engine, method, TP, concurrency, output length) overrides some.
_IMPORTED_COLUMNS = tuple(f for f in config_record.run_columns() if f.imported)


def _imported_columns(workload: dict[str, Any]) -> dict[str, Any]:
    """{column: the file's value}, or the record's missing value ("" for text, else None)."""
    return {f.name: workload[f.name] if workload.get(f.name) is not None else f.missing() for f in _IMPORTED_COLUMNS}


def _create_runs(parsed: _Parsed, sweep: Sweep, host: Host, record: ResultFile) -> list[int]:
    """Create the runs of one parsed file (move `imported -> succeeded | failed`, stored by
    runs.services.outcomes.store_outcome); returns their ids."""
    c = parsed.choice
    ids = []
    for i, imp in enumerate(parsed.file.runs):
        w = imp.workload
        method = method_of_run(imp, c.method)
        tool_engine = engine_for_tool(imp.source_tool) or ""
        server = {"extra_args": list(imp.server_args)} if imp.server_args else {}
        run = Run(
            sweep=sweep, host=host, point_key=f"import:{record.sha256[:40]}:{i}", result_file=record,
            repeat_index=imp.repeat_index or 0,
            spec={"imported": imp.origin, "file_sha256": record.sha256, "workload": w,
                  **({"server": server} if server else {})},
            **{**_imported_columns(w),
               "engine": c.engine or w.get("engine") or tool_engine,
               "method": method.method, "num_speculative_tokens": method.num_speculative_tokens,
               "tree_budget": method.tree_budget, "tp": c.tp,
               "concurrency": c.concurrency if c.concurrency is not None else w.get("concurrency"),
               "output_len": c.output_len if c.output_len is not None else w.get("output_len")},
        )
        run = store_outcome(run, _outcome(imp), origin=IMPORTED, note=f"imported from {imp.origin} ({imp.source_tool})")
        ids.append(run.pk)
    return ids


def _store(parsed: list[_Parsed], host: Host | str | None, sweep_name: str, source: str, spec: dict,
           others: list[FileReport], into: Sweep | None = None) -> ImportReport:
    """Store every parsed file in one transaction: the host (created here when named; `into`'s
    host when none is named), one new sweep (or `into`) for the files not imported before, their
    runs. Files imported before are reported."""
    if host is None and into is not None:
        host = into.host
    name = None if isinstance(host, Host) else host_name(host)
    with transaction.atomic():
        if name is not None:
            host, _ = Host.objects.get_or_create(name=name)
        sweep = into
        reports = []
        for p in parsed:
            before = ResultFile.objects.filter(sha256=p.file.sha256).first()
            if before is not None:
                runs = list(before.runs.order_by("id").values_list("id", flat=True))
                reports.append(FileReport(str(p.file.path), "existing", runs, before.sweep_id,
                                          f"imported before as {before.name} (sha256 {before.sha256[:12]})",
                                          p.file.tool))
                continue
            if sweep is None:
                sweep = Sweep.objects.create(name=sweep_name, host=host, source=f"import:{source}"[:500], spec=spec,
                                             checks_queued_at=timezone.now())
            record = ResultFile.objects.create(sha256=p.file.sha256, name=str(p.file.path)[-TEXT_LIMITS["file_name"]:],
                                               size_bytes=p.file.size_bytes, sweep=sweep,
                                               source_tool=p.file.runs[0].source_tool)
            reports.append(FileReport(str(p.file.path), "imported", _create_runs(p, sweep, host, record), sweep.pk,
                                      tool=p.file.tool))
        if sweep is not None:  # imported files keep no outputs: "not checked: imported file" (reads no blob)
            lossless.check_sweep(sweep.pk)
    return ImportReport(sweep, reports + others)


def _store_once_more_on_race(*args) -> ImportReport:
    """`_store`, retried once when a concurrent import of the same file won the unique
    constraint (the retry then reports that import's runs)."""
    try:
        return _store(*args)
    except IntegrityError:
        return _store(*args)


def import_result_file(path: str | Path, host: Host | str | None = None, sweep_name: str | None = None,
                       method: str | None = None, num_speculative_tokens: int | None = None,
                       tree_budget: int | None = None, tp: int = 1, engine: str | None = None, fmt: str = "auto",
                       aliases: dict[str, str] | None = None, into_sweep: int | None = None) -> ImportReport:
    """Store every run of the result source at `path` (a file, or a folder that a folder format
    reads) in a new sweep (default name: its name), or in the existing sweep `into_sweep` (beside
    its runs, e.g. draftboard's own measurements of the same configuration), or report its runs
    when the same bytes were imported before. `fmt`: a registered format's name, or "auto" (the
    source's markers decide).

    A file rarely says which decoding method produced it, so the caller does: `method` (a name or
    a token such as `b15`, `linear`, an alias from `aliases`), `num_speculative_tokens`,
    `tree_budget`, `tp`. A run whose file states its method (a `vllm bench sweep` folder's serve
    parameters) takes that one; `method` may then be None, and a `method` that disagrees is
    refused. `engine` defaults to what the file says (a draftboard export's engine, the
    `--server-engine` of a genai-bench experiment, ...), else the tool that wrote it. `host`: a
    Host, or a host name (default DRAFTBOARD_HOST) created inside the import's transaction.
    Raises ImportOptionError for contradictory options, HostNameError for a bad host name, and
    ResultFileError (`file:line: field: reason`) for a file that cannot be imported; nothing is
    stored then."""
    check_import_options(tp, sweep_name)
    if method is None and (num_speculative_tokens is not None or tree_budget is not None):
        raise ImportOptionError("--num-speculative-tokens / --tree-budget need --method")
    given = resolve_method(method, num_speculative_tokens, tree_budget, aliases) if method is not None else None
    choice = RunChoice(given, tp, engine)
    into = _into(into_sweep, sweep_name)
    if not isinstance(host, Host):
        host_name(host)  # a bad name fails before the file is read
    path = Path(path)
    parsed = _parse(path, fmt, choice)
    return _store_once_more_on_race([parsed], host, sweep_name or path.name[:200], str(path),
                                    {"imported_from": str(path), "fmt": fmt}, [], into)


def _into(into_sweep: int | None, sweep_name: str | None) -> Sweep | None:
    """The sweep an import adds its runs to, or None (a new sweep); ImportOptionError when unknown
    or given with a sweep name."""
    if into_sweep is None:
        return None
    if sweep_name is not None:
        raise ImportOptionError("--into-sweep adds to an existing sweep: leave out --sweep-name")
    sweep = Sweep.objects.select_related("host").filter(pk=into_sweep).first()
    if sweep is None:
        raise ImportOptionError(f"--into-sweep {into_sweep}: no such sweep")
    return sweep


def import_result_folder(folder: str | Path, name_pattern: str, host: Host | str | None = None,
                         sweep_name: str | None = None, method: str | None = None,
                         num_speculative_tokens: int | None = None, tree_budget: int | None = None, tp: int = 1,
                         engine: str | None = None, fmt: str = "auto",
                         aliases: dict[str, str] | None = None, into_sweep: int | None = None) -> ImportReport:
    """Import the result files of `folder` whose names match `name_pattern` into one new sweep
    (default name: the folder's name; or the existing sweep `into_sweep`), e.g. the users' `bench_results/` with
    `tp{tp}-{method}.json` (tokens: benchkit.formats.names).

    A name's `{method}` token goes through benchkit.methods.parse_method_token (`auto`, `linear`,
    `b15`, a method name, an alias from `aliases`); without one, `method` applies to every file.
    A name's `{tp}` overrides `tp`; `{concurrency}` and `{output_len}` must agree with the file.
    A file that cannot be imported (truncated JSON, a partial file with fewer requests than
    num_prompts, a method token the table refuses, ...) is refused with its reason and the others
    import; names that do not match are skipped. Files imported before are reported with their
    runs. Raises ImportOptionError for a bad pattern or options, HostNameError for a bad host;
    never raises for a file's content.
    """
    folder = Path(folder)
    check_import_options(tp, sweep_name)
    try:
        pattern = NamePattern(name_pattern)
    except NamePatternError as exc:
        raise ImportOptionError(f"--name-pattern: {exc}") from None
    if "method" in pattern.tokens and method is not None:
        raise ImportOptionError("--method: the name pattern already has a {method} token")
    if "method" not in pattern.tokens and method is None:
        raise ImportOptionError("--method: give one, or a {method} token in --name-pattern")
    default = resolve_method(method, num_speculative_tokens, tree_budget, aliases) if method else None
    into = _into(into_sweep, sweep_name)
    if not isinstance(host, Host):
        host_name(host)
    try:
        paths = sorted(p for p in folder.iterdir() if p.is_file())
    except OSError as exc:
        raise ImportOptionError(f"{folder}: cannot list the folder: {exc.strerror or exc}") from None
    if len(paths) > MAX_FOLDER_FILES:
        raise ImportOptionError(f"{folder}: {len(paths)} files, more than the {MAX_FOLDER_FILES} one import reads")
    parsed, others = [], []
    for path in paths:
        tokens = pattern.match(path.name)
        if tokens is None:
            others.append(FileReport(str(path), "skipped", reason=f"name does not match {name_pattern!r}"))
            continue
        try:
            choice = _choice_from_name(path, tokens, default, tp, engine, num_speculative_tokens, tree_budget,
                                       aliases)
            parsed.append(_parse(path, fmt, choice))
        except ResultFileError as exc:
            others.append(FileReport(str(path), "refused", reason=str(exc)))
    if not parsed and not any(f.status == "refused" for f in others):
        raise ImportOptionError(f"{folder}: no file name matches {name_pattern!r}")
    return _store_once_more_on_race(parsed, host, sweep_name or folder.resolve().name[:200], str(folder),
                                    {"imported_from": str(folder), "name_pattern": name_pattern, "fmt": fmt},
                                    others, into)


def _choice_from_name(path: Path, tokens: dict[str, str], default: MethodChoice | None, tp: int,
                      engine: str | None, k: int | None, budget: int | None,
                      aliases: dict[str, str] | None) -> RunChoice:
    """The RunChoice of a file from its name's tokens; ResultFileError naming the token otherwise."""
    def refuse(token: str, reason: str) -> ResultFileError:
        return ResultFileError(path, reason, field=f"name token {{{token}}}")

    choice = default
    if "method" in tokens:
        try:
            choice = resolve_method(tokens["method"], k, budget, aliases)
        except ImportOptionError as exc:
            raise refuse("method", str(exc).removeprefix("--method: ")) from None
    numbers = {}
    for token in ("tp", "concurrency", "output_len"):
        if token in tokens:
            value = int(tokens[token])
            if not 1 <= value <= INT_MAX:
                raise refuse(token, f"{tokens[token]}: must be a whole number >= 1")
            numbers[token] = value
    return RunChoice(choice, numbers.get("tp", tp), engine, numbers.get("concurrency"), numbers.get("output_len"))
