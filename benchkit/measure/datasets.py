"""Categorized prompt datasets read from local files, each record validated at the boundary
(issue 33): SPEED-Bench, MT-Bench / Spec-Bench question files, and JSON lines with an optional
`category`. Nothing is ever downloaded: every kind reads a file (or directory) already on the host.

Layouts, as the datasets ship them (the sources each layout was read from):

- `speed_bench`: nvidia/SPEED-Bench on the Hugging Face hub (its dataset card's `dataset_info`).
  One config per "split" here: `qualitative` (880 rows, 80 in each of the 11 categories coding,
  humanities, math, multilingual, qa, rag, reasoning, roleplay, stem, summarization, writing) and
  `throughput_1k`, `throughput_2k`, `throughput_8k`, `throughput_16k`, `throughput_32k` (1 536
  rows each; categories low_entropy, mixed, high_entropy); each config has the one HF split
  `test`, in parquet. Columns: `question_id` (str), `category` (str), `sub_category` (str),
  `turns` (list of str: the user turns), `source`, `src_id`, `difficulty` (str), `multiturn`
  (bool). Rows whose source may not be redistributed ship a placeholder in `turns` (text starting
  `FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH`); NVIDIA's prepare
  script (NVIDIA-NeMo/Skills nemo_skills/dataset/speed-bench/prepare.py) fills them in and writes
  `{config}.jsonl` with the same columns but `messages` ([{"role": "user", "content": str}, ...])
  in place of `turns`: the layout vLLM's `--dataset-name speed_bench` reads
  (vllm/benchmarks/datasets/datasets.py `SpeedBench`: a directory, `{subset}.jsonl`,
  `messages[0].content`) and AIPerf's `SpeedBenchRow` validates (ai-dynamo/aiperf
  aiperf/dataset/loader/speed_bench.py: it refuses the placeholder, as this module does).
  `dataset_path` is a `.parquet` file, a `.jsonl` file (either column form), or a directory
  holding `{split}.jsonl` (the prepared layout) or `{split}/*.parquet` (the hub's layout).
- `mt_bench` / `spec_bench`: one JSON object per line, `question_id` (int or str), `category`
  (str), `turns` (list of str), other keys (e.g. MT-Bench's `reference`) ignored: lm-sys FastChat
  `llm_judge/data/mt_bench/question.jsonl` and hemingkx/Spec-Bench `data/spec_bench/question.jsonl`
  (the file vLLM's `SpecBench` reads: `turns[0]`, filtered on `category`).
- `jsonl`: `{"prompt": str, "output_len": int >= 1 (optional), "category": str (optional)}` per line.

Every record is a pydantic model (`SpeedBenchRecord`, `QuestionRecord`, `JsonlRecord`; unknown
keys ignored, no type coercion): a bad record is refused as `file:line: field: reason`
(`DatasetError`, the sweep file's error style), e.g. ``q.jsonl:3: category: must not be empty``;
a parquet row's "line" is its 1-based row number. `check_dataset` runs the same reading without
a server, so a sweep or a run can refuse a bad file before any server starts.

Selection (`DatasetOptions`): `split` (SPEED-Bench config), `categories` (keep only these; each
must occur in the file), `per_category` (sample exactly this many prompts of each category,
seeded: categories are then comparable; a category with fewer is refused), `turns` ("first", the
default, or "all": every user turn becomes a prompt of its own, in order; the turns are sent as
separate single-turn requests, without the assistant's earlier replies).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, field_validator

#: The dataset kinds this module reads (the workload's `dataset` values besides `random` and
#: `sharegpt`; `jsonl` gains an optional category here).
CATEGORIZED_KINDS = ("speed_bench", "mt_bench", "spec_bench", "jsonl")

#: SPEED-Bench configs (the "split" a run names) and the categories each ships (dataset card).
SPEED_BENCH_SPLITS = {
    "qualitative": ("coding", "humanities", "math", "multilingual", "qa", "rag", "reasoning", "roleplay", "stem",
                    "summarization", "writing"),
    **{f"throughput_{n}": ("low_entropy", "mixed", "high_entropy") for n in ("1k", "2k", "8k", "16k", "32k")},
}
#: The text SPEED-Bench ships in place of a turn it may not redistribute.
SPEED_BENCH_PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
#: How many characters of a bad value an error message quotes.
_QUOTE = 60


class DatasetError(ValueError):
    """A dataset file is refused: `source` (the file), `line` (1-based line or parquet row, None
    for the whole file), `field` (a dotted path, "" for none), `message`; str() is
    `file:line: field: reason`."""

    def __init__(self, source: str, line: int | None, field_path: str, message: str):
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {field_path}: {message}" if field_path else f"{where}: {message}")
        self.source, self.line, self.field, self.message = source, line, field_path, message


@dataclass(frozen=True)
class DatasetOptions:
    """Which prompts of a categorized dataset a run sends (module docstring, "Selection").

    `split`: the SPEED-Bench config (one of SPEED_BENCH_SPLITS; default `qualitative`); ignored
    by other kinds. `categories`: keep only these (empty: all). `per_category`: prompts per
    category (seeded sample; None: every record, in file order). `turns`: "first" or "all".
    `seed`: the sampling seed (the workload's). Raises ValueError on a bad value."""

    split: str = "qualitative"
    categories: tuple[str, ...] = ()
    per_category: int | None = None
    turns: Literal["first", "all"] = "first"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.turns not in ("first", "all"):
            raise ValueError(f"turns must be 'first' or 'all', got {self.turns!r}")
        if self.per_category is not None and (isinstance(self.per_category, bool) or self.per_category < 1):
            raise ValueError(f"per_category must be an integer >= 1, got {self.per_category!r}")

    @classmethod
    def of_workload(cls, workload: Any) -> DatasetOptions:
        """The options a workload names: its `dataset_split`, `dataset_categories`,
        `prompts_per_category`, `dataset_turns` attributes where it has them (the defaults
        otherwise), and its `seed`."""
        cats = getattr(workload, "dataset_categories", None) or ()
        return cls(split=getattr(workload, "dataset_split", None) or "qualitative",
                   categories=tuple([cats] if isinstance(cats, str) else cats),
                   per_category=getattr(workload, "prompts_per_category", None),
                   turns=getattr(workload, "dataset_turns", None) or "first", seed=int(getattr(workload, "seed", 0)))


@dataclass(frozen=True)
class DatasetPrompt:
    """One prompt of a categorized dataset: `text`, `category` ("" where the file gives none),
    `prompt_id` (the record's id, `#t` appended for turn t >= 2 when every turn is sent),
    `output_len` (tokens, None: the workload's), `turn` (0-based), `line` (where it was read)."""

    text: str
    category: str = ""
    prompt_id: str = ""
    output_len: int | None = None
    turn: int = 0
    line: int = 0


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


def _turn_list(value: list[str]) -> list[str]:
    if not value:
        raise ValueError("must hold at least one turn")
    for i, turn in enumerate(value):
        if not turn.strip():
            raise ValueError(f"turn {i} is empty")
    return value


class QuestionRecord(_Record):
    """A line of an MT-Bench / Spec-Bench question file (module docstring)."""

    question_id: StrictInt | StrictStr
    category: StrictStr
    turns: list[StrictStr]

    _category = field_validator("category")(lambda cls, v: _not_blank(v))
    _turns = field_validator("turns")(lambda cls, v: _turn_list(v))


class SpeedBenchRecord(_Record):
    """A SPEED-Bench row: the hub's `turns` or the prepared `messages` (module docstring).
    `sub_category`, `source`, `src_id`, `difficulty`, `multiturn` are optional here (read, not needed)."""

    question_id: StrictStr
    category: StrictStr
    turns: list[StrictStr] | None = None
    messages: list[dict[str, Any]] | None = None
    sub_category: StrictStr | None = None
    source: StrictStr | None = None
    src_id: StrictStr | None = None
    difficulty: StrictStr | None = None
    multiturn: StrictBool | None = None

    _question_id = field_validator("question_id")(lambda cls, v: _not_blank(v))
    _category = field_validator("category")(lambda cls, v: _not_blank(v))

    def user_turns(self) -> list[str]:
        """The record's user turns; ValueError (with the field) when they are missing, empty or the placeholder."""
        if self.turns is None and self.messages is None:
            raise _FieldError("turns", "missing (a SPEED-Bench row has `turns`, or `messages` once prepared)")
        if self.turns is not None:
            where, turns = "turns", self.turns
        else:
            where, turns = "messages", []
            for i, m in enumerate(self.messages or []):
                content = m.get("content")
                if not isinstance(content, str):
                    raise _FieldError(f"messages[{i}].content", "must be a string")
                if m.get("role", "user") == "user":
                    turns.append(content)
        if not turns:
            raise _FieldError(where, "must hold at least one user turn")
        for i, turn in enumerate(turns):
            if not turn.strip():
                raise _FieldError(f"{where}[{i}]", "turn is empty")
            if turn.startswith(SPEED_BENCH_PLACEHOLDER):
                raise _FieldError(f"{where}[{i}]", "is SPEED-Bench's placeholder for text it may not redistribute; "
                                  "fill it in first with NVIDIA's prepare script (NVIDIA-NeMo/Skills "
                                  "nemo_skills/dataset/speed-bench/prepare.py)")
        return turns


class JsonlRecord(_Record):
    """A line of a plain JSON-lines prompt file (module docstring)."""

    prompt: StrictStr
    output_len: StrictInt | None = Field(default=None, ge=1)
    category: StrictStr | None = None

    _prompt = field_validator("prompt")(lambda cls, v: _not_blank(v))
    _category = field_validator("category")(lambda cls, v: v if v is None else _not_blank(v))


class _FieldError(ValueError):
    def __init__(self, field_path: str, message: str):
        super().__init__(message)
        self.field, self.message = field_path, message


def _first_problem(exc: ValidationError) -> tuple[str, str]:
    """(field path, reason) of a pydantic error's first entry, in the project's words."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in err["loc"]).replace(".[", "[")
    kind, msg = err["type"], err["msg"]
    if kind == "missing":
        msg = "missing"
    elif kind == "value_error":
        msg = msg.removeprefix("Value error, ")
    elif "input" in err and kind.endswith("_type"):
        msg = f"{msg.lower()}, got {type(err['input']).__name__} {str(err['input'])[:_QUOTE]!r}"
    else:
        msg = msg[:1].lower() + msg[1:]
    return loc, msg


def _validate(model: type[_Record], obj: Any, source: str, line: int) -> _Record:
    if not isinstance(obj, dict):
        raise DatasetError(source, line, "", f"expected a JSON object, got {type(obj).__name__}")
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise DatasetError(source, line, *_first_problem(exc)) from None


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based line, parsed object) of every non-blank line; DatasetError for unreadable text or bad JSON."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(str(path), None, "", "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(str(path), None, "", f"cannot read ({exc})") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(str(path), lineno, "", f"not valid JSON ({exc.msg})") from None


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based row, row as plain Python values) of a parquet file (pandas + pyarrow)."""
    try:
        import pandas as pd
        frame = pd.read_parquet(path)
    except ImportError as exc:
        raise DatasetError(str(path), None, "", f"reading parquet needs pyarrow ({exc})") from None
    except (OSError, ValueError) as exc:
        raise DatasetError(str(path), None, "", f"cannot read parquet ({exc})") from None
    for i, row in enumerate(frame.to_dict(orient="records"), start=1):
        yield i, {k: _plain(v) for k, v in row.items()}


def _plain(value: Any) -> Any:
    """A parquet cell as the JSON value it stands for (numpy arrays and scalars made Python)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or (isinstance(value, float) and value != value):  # a missing cell (None / NaN)
        return None
    return value


def _speed_bench_files(path: Path, split: str) -> list[Path]:
    """The files of SPEED-Bench split `split` under `path` (module docstring)."""
    if split not in SPEED_BENCH_SPLITS:
        raise DatasetError(str(path), None, "split",
                           f"unknown SPEED-Bench split {split!r} (known: {', '.join(SPEED_BENCH_SPLITS)})")
    if not path.exists():
        raise DatasetError(str(path), None, "", "no such file or directory")
    if not path.is_dir():
        return [path]
    prepared = path / f"{split}.jsonl"
    if prepared.is_file():
        return [prepared]
    hub = sorted((path / split).glob("*.parquet")) if (path / split).is_dir() else []
    if hub:
        return hub
    raise DatasetError(str(path), None, "split", f"no {split}.jsonl or {split}/*.parquet for split {split!r}")


def _rows(path: Path) -> Iterator[tuple[int, Any]]:
    return _parquet_rows(path) if path.suffix == ".parquet" else _json_lines(path)


def read_dataset(kind: str, path: str | Path, options: DatasetOptions | None = None) -> list[DatasetPrompt]:
    """Every prompt of the dataset file(s) at `path` of kind `kind` (CATEGORIZED_KINDS), each
    record validated, in file order; with `options.turns == "all"` each turn is a prompt.
    Categories are not yet filtered or sampled (`select_prompts` does). Raises DatasetError
    (`file:line: field: reason`) for a missing path, an unknown split or kind, a bad record."""
    opts = options or DatasetOptions()
    p = Path(path)
    if not str(path):
        raise DatasetError("workload", None, "dataset_path", f"dataset {kind!r} needs a path")
    if kind == "speed_bench":
        files = _speed_bench_files(p, opts.split)
    elif kind in ("mt_bench", "spec_bench", "jsonl"):
        if not p.is_file():
            raise DatasetError(str(p), None, "", "no such file" if not p.exists() else "not a file")
        files = [p]
    else:
        raise DatasetError("workload", None, "dataset",
                           f"unknown dataset kind {kind!r} (categorized kinds: {', '.join(CATEGORIZED_KINDS)})")
    out: list[DatasetPrompt] = []
    for f in files:
        out.extend(_prompts_of(kind, f, opts))
    return out


def _prompts_of(kind: str, path: Path, opts: DatasetOptions) -> Iterator[DatasetPrompt]:
    source = str(path)
    for line, obj in _rows(path):
        if kind == "jsonl":
            rec = _validate(JsonlRecord, obj, source, line)
            yield DatasetPrompt(rec.prompt, rec.category or "", f"line{line}", rec.output_len, 0, line)
            continue
        if kind == "speed_bench":
            rec = _validate(SpeedBenchRecord, obj, source, line)
            try:
                turns = rec.user_turns()
            except _FieldError as exc:
                raise DatasetError(source, line, exc.field, exc.message) from None
        else:
            rec = _validate(QuestionRecord, obj, source, line)
            turns = rec.turns
        qid = str(rec.question_id)
        for t, text in enumerate(turns if opts.turns == "all" else turns[:1]):
            yield DatasetPrompt(text, rec.category, qid if t == 0 else f"{qid}#{t + 1}", None, t, line)


def select_prompts(prompts: list[DatasetPrompt], options: DatasetOptions,
                   source: str = "dataset") -> list[DatasetPrompt]:
    """The prompts a run sends: only `options.categories` (each must occur), then with
    `per_category` exactly that many of each category, drawn without replacement with
    numpy's default_rng(seed) from the category's prompts, the categories interleaved (prompt i of
    every category, in sorted category order, then prompt i + 1: warmup and any prefix of the list
    span every category); without `per_category` every prompt in file order. Whole records are
    drawn: with every turn sent, a record's turns stay together and in order. Raises DatasetError
    for a category that is absent or has fewer prompts than asked."""
    by_cat: dict[str, list[DatasetPrompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    if options.categories:
        missing = [c for c in options.categories if c not in by_cat]
        if missing:
            raise DatasetError(source, None, "categories",
                               f"no prompt of categor{'y' if len(missing) == 1 else 'ies'} "
                               f"{', '.join(map(repr, missing))} "
                               f"(the file has: {', '.join(sorted(by_cat)) or 'none'})")
        keep = set(options.categories)
        prompts = [p for p in prompts if p.category in keep]
        by_cat = {c: v for c, v in by_cat.items() if c in keep}
    if options.per_category is None:
        return list(prompts)
    rng = np.random.default_rng(options.seed)
    picked: dict[str, list[list[DatasetPrompt]]] = {}
    for cat in sorted(by_cat):
        records = _records(by_cat[cat])
        n_prompts = sum(len(r) for r in records)
        if n_prompts < options.per_category:
            raise DatasetError(source, None, "per_category",
                               f"category {cat!r} has {n_prompts} prompt(s), {options.per_category} asked")
        order = rng.permutation(len(records))
        chosen, count = [], 0
        for i in order.tolist():
            if count >= options.per_category:
                break
            take = records[i][:options.per_category - count]
            chosen.append(take)
            count += len(take)
        picked[cat] = chosen
    flat = {cat: [p for rec in recs for p in rec] for cat, recs in picked.items()}
    return [flat[cat][i] for i in range(options.per_category) for cat in sorted(flat)]


def _records(prompts: list[DatasetPrompt]) -> list[list[DatasetPrompt]]:
    """Prompts grouped by the record (line) they came from, in order."""
    groups: list[list[DatasetPrompt]] = []
    for p in prompts:
        if groups and groups[-1][0].line == p.line and p.turn > 0:
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def load_prompts(kind: str, path: str | Path, options: DatasetOptions | None = None) -> list[DatasetPrompt]:
    """`select_prompts(read_dataset(kind, path, options), options)`: what a run sends."""
    opts = options or DatasetOptions()
    return select_prompts(read_dataset(kind, path, opts), opts, str(path))


def run_selection(workload: Any, n: int) -> list[DatasetPrompt]:
    """The `n` prompts a run of `workload` sends (a categorized kind), warmup first: without a
    per-category count, the first `n` of the selection (`load_prompts`); with one, the first
    n - warmup of the seeded per-category sample, preceded by warmup prompts taken from outside
    it (`with_warmup`), so the measured per-category counts stay as sampled. Needs no server.
    Raises DatasetError (`file:line: field: reason`, or the file and what is short)."""
    opts = DatasetOptions.of_workload(workload)
    source = str(workload.dataset_path)
    n_warm = min(workload.n_warmup, n)
    every = read_dataset(workload.dataset, workload.dataset_path, opts)
    chosen = select_prompts(every, opts, source)
    if opts.per_category is None:
        if len(chosen) < n:
            raise DatasetError(source, None, "", f"{len(chosen)} prompt(s) selected, the run needs {n} (warmup + "
                                                 "num_prompts; prompts are not reused, so the prefix cache stays cold)")
        return chosen[:n]
    measured = chosen[:n - n_warm]
    if len(measured) < n - n_warm:
        raise DatasetError(source, None, "", f"{len(chosen)} prompt(s) sampled ({opts.per_category} per category), "
                                             f"the run measures {n - n_warm}")
    pool = [p for p in every if not opts.categories or p.category in opts.categories]
    return with_warmup(pool, measured, n_warm, source)


def check_dataset(workload: Any, count: int | None = None) -> list[DatasetPrompt] | None:
    """Read and validate the workload's dataset without a server (None for a kind this module
    does not read): call before a server starts so that a bad file is refused first. Returns
    what a run sends (`run_selection` of `count` prompts, default warmup + num_prompts). Raises
    DatasetError."""
    if getattr(workload, "dataset", "random") not in CATEGORIZED_KINDS:
        return None
    return run_selection(workload, count if count is not None else workload.n_warmup + workload.num_prompts)


def category_counts(prompts: Iterable[DatasetPrompt]) -> dict[str, int]:
    """{category: prompts} in sorted category order."""
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.category] = counts.get(p.category, 0) + 1
    return dict(sorted(counts.items()))



def with_warmup(candidates: list[DatasetPrompt], measured: list[DatasetPrompt], n_warmup: int,
                source: str = "dataset") -> list[DatasetPrompt]:
    """`n_warmup` warmup prompts followed by `measured`: the warmup prompts are the first of
    `candidates` (file order) that are not measured, so warmup never warms the prefix cache for a
    measured prompt and the measured per-category counts stay as sampled. Raises DatasetError
    when too few are left."""
    used = {id(p) for p in measured}
    spare = [p for p in candidates if id(p) not in used][:n_warmup]
    if len(spare) < n_warmup:
        raise DatasetError(source, None, "",
                           f"{len(spare)} prompt(s) left outside the measured sample for {n_warmup} warmup request(s)")
    return spare + list(measured)
