"""Build two tiny demo model directories (a target and a draft model) with no download.

vLLM can serve a model directory that holds only a `config.json` and a tokenizer when it is
started with `--load-format dummy` (random weights; docs/ENVIRONMENT.md). That is enough to run
every code path of draftboard end to end on a CPU-only machine: server start, readiness,
streaming, speculative decoding with `draft_model` (the draft model inherits the target's load
config, so it is dummy-loaded too: vllm/model_executor/model_loader/utils.py
`get_draft_load_config`), Prometheus counters and teardown.

The draft is the target's first layer: same hidden size, heads and vocab, 1 layer instead of 4.
vLLM's dummy loader seeds every parameter with the same seed
(vllm/model_executor/model_loader/weight_utils.py `initialize_single_dummy_weight`, seed 1234),
so tensors of equal shape get equal values: the draft's embeddings, LM head and its one layer
equal the target's, and as the dummy weights are tiny (uniform in +-1e-3) the residual stream
is dominated by the embedding, so the draft mostly predicts what the target predicts. That
gives a demo with real, non-trivial acceptance (and a real speedup on the CPU) instead of
zero acceptance between two unrelated random models. The text itself is meaningless (it
loops), so n-gram drafting also accepts. Both directories are marked as demo models
(`draftboard_demo: true` in `config.json` and a README.md) so that nobody mistakes their
numbers for a real model's.

Layout under `root`::

    root/target/   config.json (4-layer, 256-wide LlamaForCausalLM), tokenizer files, README.md
    root/draft/    config.json (1-layer, 256-wide LlamaForCausalLM), same tokenizer files
    root/prompts.txt  one plain-text prompt per line (module docstrings of the standard library)
    root/.draftboard_demo.json  marker: builder version, content hash, files

The tokenizer is a byte-level BPE (vocab 2048) trained in about a second with the `tokenizers`
library on a fixed list of Python standard-library sources, so it is deterministic for one
Python version.
"""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUILDER_VERSION = 1
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
#: config.json of the draft model: the target's shapes with 1 layer (see the module doc for why).
DRAFT_CONFIG = _llama_config(layers=1, hidden=256, heads=4, intermediate=688, role="draft")

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

Random-weight demo model built locally by `benchkit.engines.demo_models.build_demo_models`
(no download). It holds only a config and a tokenizer: serve it with `--load-format dummy`.
Its outputs are random text and every number measured on it (speed, acceptance) is
meaningless except as a test of the measuring pipeline. `config.json` carries
`"draftboard_demo": true`; runs on it are flagged as demo runs.

Architecture: LlamaForCausalLM, {layers} layers, hidden size {hidden}, vocab {vocab},
max_position_embeddings {maxpos}. Tokenizer: byte-level BPE trained on Python
standard-library sources.
"""

MODEL_FILES = (
    "config.json",
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


def spec_hash() -> str:
    """SHA-256 (hex) over everything that defines the demo set: builder version, configs,
    tokenizer settings and corpus file list. A marker with another hash triggers a rebuild."""
    blob = json.dumps(
        {
            "builder": BUILDER_VERSION,
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


def _write_model_dir(path: Path, config: dict[str, Any], tokenizer_json: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    _write_json(path / "config.json", config)
    _write_json(path / "generation_config.json", GENERATION_CONFIG)
    (path / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    _write_json(path / "tokenizer_config.json", TOKENIZER_CONFIG)
    _write_json(path / "special_tokens_map.json", SPECIAL_TOKENS_MAP)
    (path / "README.md").write_text(
        README.format(
            role=config["draftboard_demo_role"],
            layers=config["num_hidden_layers"],
            hidden=config["hidden_size"],
            vocab=config["vocab_size"],
            maxpos=config["max_position_embeddings"],
        ),
        encoding="utf-8",
    )


def _expected_files(root: Path) -> list[Path]:
    files = [root / "prompts.txt"]
    for sub in ("target", "draft"):
        files += [root / sub / name for name in MODEL_FILES]
    return files


def is_complete(root: Path) -> bool:
    """True when `root` holds a finished demo set of the current `spec_hash()` (marker present,
    hash equal, every file present and non-empty)."""
    marker = root / MARKER_NAME
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if data.get("spec_hash") != spec_hash():
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


def build_demo_models(root: Path | str, force: bool = False) -> DemoModels:
    """Create (or reuse) the demo target and draft model directories under `root`.

    Idempotent: when the marker file `root/.draftboard_demo.json` has the current content hash
    and every file exists, nothing is written. Otherwise (or with `force`) `target/`, `draft/`
    and `prompts.txt` are rebuilt; the marker is written last, so an interrupted build is
    detected as incomplete and redone. Returns `DemoModels(target, draft, prompts, root)`.

    Raises DemoModelError when the tokenizer cannot be trained (see `train_tokenizer`).
    """
    root = Path(root).expanduser().resolve()
    models = DemoModels(target=root / "target", draft=root / "draft", prompts=root / "prompts.txt", root=root)
    if not force and is_complete(root):
        return models
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER_NAME).unlink(missing_ok=True)
    for sub in (models.target, models.draft):
        if sub.exists():
            shutil.rmtree(sub)
    tokenizer_json = train_tokenizer().to_str(pretty=False)
    _write_model_dir(models.target, TARGET_CONFIG, tokenizer_json)
    _write_model_dir(models.draft, DRAFT_CONFIG, tokenizer_json)
    models.prompts.write_text("\n".join(sample_prompts()) + "\n", encoding="utf-8")
    _write_json(
        root / MARKER_NAME,
        {
            "builder_version": BUILDER_VERSION,
            "spec_hash": spec_hash(),
            "tokenizer_sha256": hashlib.sha256(tokenizer_json.encode()).hexdigest(),
            "files": sorted(str(p.relative_to(root)) for p in _expected_files(root)),
        },
    )
    return models
