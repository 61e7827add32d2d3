"""A model the user names, as a transformers checkpoint folder: a folder as it is, a GGUF file converted once into
the cache, or a hub id read from the machine's hub cache only (never fetched: runs and tests stay offline).

The local engine, a target derived from its checkpoint (`target = "auto"`) and the hidden-state capture all read
the same folder, so the ids a row is trained on and the model that wrote it come from one place.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from eagle_data import settings
from eagle_data.types import UserError

CONVERTED_MARK = "EAGLE_DATA_CHECKPOINT.json"  # written last into a converted folder: it is whole


class CheckpointError(UserError, ValueError):
    """A model reference that names no usable checkpoint; the message says which and what to do."""


def checkpoint_folder(ref: str, *, needs: str = "config.json", hint: str = "") -> Path:
    """The folder of `ref`: a local folder holding `needs`, a `.gguf` file (converted into the cache on first use),
    or a hub id already in the local hub cache. `hint` ends the error line (which variable to set)."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / needs).is_file():
            hint = hint or "name a transformers checkpoint folder"
            raise CheckpointError(f"{path}: no {needs} in this folder; {hint}")
        return path.resolve()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise CheckpointError(f"{path}: no such GGUF file")
        return converted_gguf(path)
    if path.is_absolute() or ref.startswith((".", "~")) or ref.count("/") != 1:
        raise CheckpointError(f"{ref}: no such folder; {hint or 'name a transformers checkpoint folder'}")
    return _hub_cached(ref, needs, hint)


def _hub_cached(repo_id: str, needs: str, hint: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as exc:  # the hub raises several kinds for "not cached"; all mean the same here
        raise CheckpointError(
            f"{repo_id}: not available offline (not in the local Hugging Face cache: {type(exc).__name__}); "
            f"{hint or 'download it, or name a local folder'}"
        ) from exc
    if not (folder / needs).is_file():
        hint = hint or "name a local folder"
        raise CheckpointError(f"{repo_id}: the cached snapshot {folder} has no {needs}; {hint}")
    return folder


def converted_gguf(gguf: Path, out: Path | None = None) -> Path:
    """A transformers folder made from a GGUF file (dequantized to float32) once, keyed by the file's digest;
    built beside its place and renamed in, so two processes converting at once never read half a folder."""
    gguf = gguf.resolve()
    if out is None:
        out = settings.cache_folder() / "checkpoints" / f"{gguf.stem}-{_digest(gguf)[:16]}"
    if (out / CONVERTED_MARK).is_file():
        return out
    staging = out.with_name(f"{out.name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    _convert(gguf, staging)
    try:
        os.replace(staging, out)
    except OSError:  # another process put it in place first (or left an unfinished folder there)
        if not (out / CONVERTED_MARK).is_file():
            shutil.rmtree(out, ignore_errors=True)
            os.replace(staging, out)
    shutil.rmtree(staging, ignore_errors=True)
    return out


def _convert(gguf: Path, out: Path) -> None:
    """transformers dequantizes a GGUF on load but refuses to save a GGUF-quantized model: build the same
    architecture from its config (without the quantization entry) and load the dequantized weights into it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as exc:
        raise CheckpointError(f"{gguf}: reading a GGUF file needs the `gguf` package: pip install gguf") from exc
    except Exception as exc:  # the gguf reader raises many kinds for a bad file; all are this one line
        raise CheckpointError(f"{gguf}: the gguf package cannot read this file ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160] if str(exc) else 'no detail'})") from exc
    config = loaded.config
    for key in ("quantization_config", "_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / CONVERTED_MARK).write_text(json.dumps({"gguf": gguf.name, "sha256": _digest(gguf)}, indent=1))


def _digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
