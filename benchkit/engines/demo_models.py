"""Build two tiny demo models with real, locally trained weights (a target and a draft model), no download.

The target is a 4-layer, 256-wide `LlamaForCausalLM` trained for a fixed number of steps (about
a minute on two CPU cores) on Python standard-library sources; the draft model is one layer of
the same width, distilled from the target (benchkit.engines.demo_train). Their greedy outputs
agree on many tokens but not all, so speculative decoding with `draft_model` accepts part of
what the draft proposes (tau below k+1, falling per position) as a real drafter does, and the
demo shows the trade-off of real speculative decoding on a CPU: acceptance grows with k while
the speed peaks at a middle k. Both directories hold a `model.safetensors` that vLLM and
transformers load as they are (no `--load-format dummy`). Both are marked as demo models
(`draftboard_demo: true` in `config.json` and a README.md) so that nobody mistakes their numbers
for a real model's: the text they write is Python-flavoured babble.

Layout under `root`::

    root/target/   config.json (4-layer, 256-wide LlamaForCausalLM), model.safetensors,
                   tokenizer files, README.md
    root/draft/    config.json (1-layer, 256-wide LlamaForCausalLM), model.safetensors,
                   same tokenizer files
    root/prompts.txt  one plain-text prompt per line (module docstrings of the standard library)
    root/.draftboard_demo.json  marker: builder version, spec hash, training report, files

The tokenizer is a byte-level BPE (vocab 2048) trained in about a second with the `tokenizers`
library on a fixed list of Python standard-library sources. Everything is deterministic for one
Python and torch version on one machine (seeded, fixed thread count); the spec hash covers the
configs, the training spec and both versions, and a set built under another hash is rebuilt.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchkit.engines.demo_train import TrainReport, TrainSpec

BUILDER_VERSION = 2
VOCAB_SIZE = 2048
MAX_POSITION_EMBEDDINGS = 2048
MARKER_NAME = ".draftboard_demo.json"
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

#: Standard-library sources the tokenizer is trained on (relative to the stdlib directory).
#: Missing ones are skipped; at least one must exist.
CORPUS_FILES = (
    "textwrap.py",
    "string.py",
    "heapq.py",
    "bisect.py",
    "functools.py",
    "dataclasses.py",
    "argparse.py",
    "json/decoder.py",
    "json/encoder.py",
    "collections/__init__.py",
    "pathlib.py",
    "csv.py",
    "statistics.py",
    "fractions.py",
)

#: Modules whose docstrings become sample prompts (prompts.txt).
PROMPT_MODULES = CORPUS_FILES + (
    "random.py",
    "shutil.py",
    "tempfile.py",
    "subprocess.py",
    "threading.py",
    "logging/__init__.py",
    "http/server.py",
    "email/message.py",
    "difflib.py",
    "inspect.py",
)

# A minimal chat template so that /v1/chat/completions works on the demo models.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<s>' + message['role'] + '\\n' + message['content'] + '</s>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant\\n' }}{% endif %}"
)


def _llama_config(layers: int, hidden: int, heads: int, intermediate: int, role: str) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": UNK_ID,
        "torch_dtype": "float32",
        "draftboard_demo": True,
        "draftboard_demo_role": role,
    }


#: config.json of the target: 4 layers, hidden 256, 4 heads of 64.
TARGET_CONFIG = _llama_config(layers=4, hidden=256, heads=4, intermediate=688, role="target")
#: config.json of the draft model: the target's shapes with 1 layer (distilled from the target).
DRAFT_CONFIG = _llama_config(layers=1, hidden=256, heads=4, intermediate=688, role="draft")

#: How the demo pair is trained (benchkit.engines.demo_train.TrainSpec): under a minute of two
#: quiet CPU cores in all. The target's greedy text repeats itself (a tiny model trained briefly),
#: so the distilled draft alone agrees on about 94 % of its greedy tokens (tau close to k+1); the
#: seeded noise (`draft_noise`, drawn from seed + 1 over the sorted tensor names) brings that to
#: about 84 %. Offline estimate on 8 random 64-token prompts, 96 greedy tokens each: tau about
#: 1.84, 2.58, 3.94 and 6.52 for k = 1, 2, 4, 8 (noise 0: 1.97, 2.81, 4.38, 7.26). Agreement is
#: all or nothing per repeated phrase, so a larger noise soon leaves a useless draft (seen: at
#: 1.2 with another noise draw, tau 1.03 for k = 1 on the vLLM server).
TRAIN_SPEC = TrainSpec(target_steps=150, draft_steps=40, batch=8, seq_len=64, lr=5e-3, warmup_steps=10,
                       seed=0, threads=2, draft_noise=0.7)
#: A few steps of tiny batches (about a second): weights that load and run but barely agree
#: with anything; for tests that need the files, not the acceptance (`default_train_spec`).
QUICK_TRAIN_SPEC = TrainSpec(target_steps=3, draft_steps=2, batch=2, seq_len=32, lr=5e-3, warmup_steps=1,
                             seed=0, threads=2)
#: Set to 1 to build with QUICK_TRAIN_SPEC wherever no spec is given (the test suite does).
QUICK_ENV = "DRAFTBOARD_DEMO_QUICK"
WEIGHTS_NAME = "model.safetensors"


def default_train_spec() -> TrainSpec:
    """TRAIN_SPEC, or QUICK_TRAIN_SPEC when the environment sets DRAFTBOARD_DEMO_QUICK=1."""
    return QUICK_TRAIN_SPEC if os.environ.get(QUICK_ENV) == "1" else TRAIN_SPEC

TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<unk>",
    "model_max_length": MAX_POSITION_EMBEDDINGS,
    "add_bos_token": False,
    "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "chat_template": CHAT_TEMPLATE,
}
SPECIAL_TOKENS_MAP = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"}
GENERATION_CONFIG = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": UNK_ID}

README = """# draftboard demo model ({role})

Demo model trained locally by `benchkit.engines.demo_models.build_demo_models` (no download):
{how}. Its weights are real (`model.safetensors`) but tiny: it writes Python-flavoured
babble, and the numbers measured on it show how speculative decoding behaves with a draft
that agrees only partly with its target, not any real model's speed. `config.json` carries
`"draftboard_demo": true`; runs on it are flagged as demo runs.

Architecture: LlamaForCausalLM, {layers} layers, hidden size {hidden}, vocab {vocab},
max_position_embeddings {maxpos}. Tokenizer: byte-level BPE trained on Python
standard-library sources.
"""

HOW = {
    "target": "trained for {target_steps} steps of {batch} x {seq_len} tokens on Python standard-library sources",
    "draft": "distilled for {draft_steps} steps from the demo target, starting from its embeddings, first "
             "layer and head, then perturbed with seeded noise ({draft_noise} x each matrix's std)",
}

MODEL_FILES = (
    "config.json",
    WEIGHTS_NAME,
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "README.md",
)


@dataclass
class DemoModels:
    """Paths of a built demo set: `target` and `draft` model directories, `prompts` text file."""

    target: Path
    draft: Path
    prompts: Path
    root: Path


class DemoModelError(RuntimeError):
    """The demo models could not be built (e.g. no standard-library sources to train on)."""


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _corpus_paths() -> list[Path]:
    base = _stdlib_dir()
    paths = [base / rel for rel in CORPUS_FILES if (base / rel).is_file()]
    if not paths:
        raise DemoModelError(f"no standard-library sources found under {base} to train the demo tokenizer")
    return paths


def _torch_version() -> str:
    try:
        import torch
    except ImportError:
        return ""
    return str(torch.__version__)


def spec_hash(train: TrainSpec | None = None) -> str:
    """SHA-256 (hex) over everything that defines the demo set: builder version, configs,
    tokenizer settings, corpus file list, training spec `train`, and the Python and torch
    versions (trained weights depend on both). A marker with another hash triggers a rebuild."""
    train = train or default_train_spec()
    blob = json.dumps(
        {
            "builder": BUILDER_VERSION,
            "train": train.as_dict(),
            "python": platform.python_version(),
            "torch": _torch_version(),
            "target": TARGET_CONFIG,
            "draft": DRAFT_CONFIG,
            "tokenizer_config": TOKENIZER_CONFIG,
            "vocab": VOCAB_SIZE,
            "corpus": CORPUS_FILES,
            "prompts": PROMPT_MODULES,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def train_tokenizer():
    """Train the byte-level BPE tokenizer (vocab `VOCAB_SIZE`, special tokens `<unk>` 0, `<s>` 1,
    `</s>` 2) on `CORPUS_FILES`. Returns a `tokenizers.Tokenizer`.

    Raises DemoModelError when the trained vocabulary is not exactly `VOCAB_SIZE` (corpus too
    small), since config.json's `vocab_size` must cover every token id.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in _corpus_paths()]
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise DemoModelError(
            f"demo tokenizer trained to {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}: "
            "corpus too small"
        )
    return tok


def corpus_token_ids(tok) -> list[int]:
    """The training corpus as one stream of token ids: `CORPUS_FILES` in order, each encoded
    with `tok` (a `tokenizers.Tokenizer`) and followed by `</s>`."""
    ids: list[int] = []
    for path in _corpus_paths():
        ids += tok.encode(path.read_text(encoding="utf-8", errors="replace")).ids + [EOS_ID]
    return ids


def sample_prompts(max_prompts: int = 64, max_chars: int = 400) -> list[str]:
    """Plain-text prompts from standard-library module docstrings (first paragraphs, one line
    each, at most `max_chars` characters), in a fixed order. Used for prompts.txt."""
    base = _stdlib_dir()
    prompts: list[str] = []
    for rel in PROMPT_MODULES:
        path = base / rel
        if not path.is_file():
            continue
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8", errors="replace")))
        except SyntaxError:
            continue
        if not doc:
            continue
        for para in doc.split("\n\n"):
            line = " ".join(para.split())
            if len(line) >= 40:
                prompts.append(line[:max_chars])
            if len(prompts) >= max_prompts:
                return prompts
    return prompts


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_model_dir(path: Path, config: dict[str, Any], tokenizer_json: str, tensors: dict[str, Any],
                     train: TrainSpec) -> str:
    """Write one model directory; returns the SHA-256 (hex) of its weights file."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    _write_json(path / "config.json", config)
    save_file(tensors, str(path / WEIGHTS_NAME), metadata={"format": "pt"})
    _write_json(path / "generation_config.json", GENERATION_CONFIG)
    (path / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    _write_json(path / "tokenizer_config.json", TOKENIZER_CONFIG)
    _write_json(path / "special_tokens_map.json", SPECIAL_TOKENS_MAP)
    (path / "README.md").write_text(
        README.format(
            role=config["draftboard_demo_role"],
            how=HOW[config["draftboard_demo_role"]].format(**train.as_dict()),
            layers=config["num_hidden_layers"],
            hidden=config["hidden_size"],
            vocab=config["vocab_size"],
            maxpos=config["max_position_embeddings"],
        ),
        encoding="utf-8",
    )
    return hashlib.sha256((path / WEIGHTS_NAME).read_bytes()).hexdigest()


def _expected_files(root: Path) -> list[Path]:
    files = [root / "prompts.txt"]
    for sub in ("target", "draft"):
        files += [root / sub / name for name in MODEL_FILES]
    return files


def is_complete(root: Path, train: TrainSpec | None = None) -> bool:
    """True when `root` holds a finished demo set of `spec_hash(train)` (marker present, hash
    equal, every file present and non-empty); `train` defaults to `default_train_spec()`."""
    marker = root / MARKER_NAME
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if data.get("spec_hash") != spec_hash(train):
        return False
    return all(p.is_file() and p.stat().st_size > 0 for p in _expected_files(root))


def is_demo_model(model_dir: str | Path) -> bool:
    """True when `model_dir/config.json` carries `"draftboard_demo": true`. False when the file
    is missing or unreadable."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(isinstance(cfg, dict) and cfg.get("draftboard_demo"))


def read_marker(root: Path | str) -> dict[str, Any]:
    """The build marker of a demo set (spec hash, training report, weight hashes, files); {}
    when missing or unreadable."""
    try:
        data = json.loads((Path(root) / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def build_demo_models(root: Path | str, force: bool = False, train: TrainSpec | None = None) -> DemoModels:
    """Create (or reuse) the demo target and draft model directories under `root`.

    Idempotent: when the marker file `root/.draftboard_demo.json` has the current spec hash
    (`spec_hash(train)`; `train` defaults to `default_train_spec()`) and every file exists,
    nothing is written. Otherwise (or with `force`)
    the tokenizer is trained, the pair is trained with `train` (benchkit.engines.demo_train;
    about a minute of two CPU cores with the default `TRAIN_SPEC`) and `target/`, `draft/` and
    `prompts.txt` are rewritten; the marker is written last, so an interrupted build is detected
    as incomplete and redone. Returns `DemoModels(target, draft, prompts, root)`; the marker
    (`read_marker`) holds the training report (losses, greedy agreement, seconds).

    Raises DemoModelError when the tokenizer cannot be trained (see `train_tokenizer`) or torch
    is not installed.
    """
    root = Path(root).expanduser().resolve()
    train = train or default_train_spec()
    models = DemoModels(target=root / "target", draft=root / "draft", prompts=root / "prompts.txt", root=root)
    if not force and is_complete(root, train):
        return models
    try:
        from benchkit.engines.demo_train import train_pair
    except ImportError as exc:  # pragma: no cover - torch is in the demo's requirements
        raise DemoModelError(f"training the demo models needs torch: {exc}") from None
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER_NAME).unlink(missing_ok=True)
    for sub in (models.target, models.draft):
        if sub.exists():
            shutil.rmtree(sub)
    tok = train_tokenizer()
    tokenizer_json = tok.to_str(pretty=False)
    try:
        target_w, draft_w, report = train_pair(corpus_token_ids(tok), TARGET_CONFIG, DRAFT_CONFIG, train)
    except ImportError as exc:
        raise DemoModelError(f"training the demo models needs torch: {exc}") from None
    weights = {
        "target": _write_model_dir(models.target, TARGET_CONFIG, tokenizer_json, target_w, train),
        "draft": _write_model_dir(models.draft, DRAFT_CONFIG, tokenizer_json, draft_w, train),
    }
    models.prompts.write_text("\n".join(sample_prompts()) + "\n", encoding="utf-8")
    _write_json(
        root / MARKER_NAME,
        {
            "builder_version": BUILDER_VERSION,
            "spec_hash": spec_hash(train),
            "train": train.as_dict(),
            "report": _report_dict(report),
            "weights_sha256": weights,
            "tokenizer_sha256": hashlib.sha256(tokenizer_json.encode()).hexdigest(),
            "files": sorted(str(p.relative_to(root)) for p in _expected_files(root)),
        },
    )
    return models


def _report_dict(report: TrainReport) -> dict[str, float]:
    return {k: round(v, 4) for k, v in report.as_dict().items()}
