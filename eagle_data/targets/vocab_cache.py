"""Built-in tokenizers kept on disk, so a new process loads one (~1 CPU-s) instead of converting BPE ranks (5-8).

Every Dagster step that tokenizes starts a fresh process, so without this each step paid the conversion.
A file's name holds a key over everything the result depends on (the recipe, its inputs, the layout, the
library versions): a change to any gives a new file, never a stale one. A file is trusted only after it parses
and holds the builtin's layout (vocab size, every special token at its id); otherwise it is rebuilt and
replaced. Files are written beside their place and renamed into it, so parallel processes never read half of
one. A folder that cannot be written costs only the speed: the tokenizer is built in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from tokenizers import Tokenizer

from eagle_data import settings

FORMAT_VERSION = "1"  # bump when what a cache file holds, or how it is keyed, changes
LIBRARIES = ("tokenizers", "transformers")  # the converter and the format: a new version of either rebuilds
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Layout:
    """What a built tokenizer must hold; cheap to check against a loaded file (well under a millisecond)."""

    vocab_size: int
    specials: Mapping[str, int]  # special token -> its id

    def problem(self, tokenizer: Tokenizer) -> str:
        """Why `tokenizer` does not hold this layout; "" when it does."""
        if (size := tokenizer.get_vocab_size(with_added_tokens=True)) != self.vocab_size:
            return f"vocab size {size}, expected {self.vocab_size}"
        added = tokenizer.get_added_tokens_decoder()
        for text, idx in self.specials.items():
            if (token := added.get(idx)) is None or token.content != text or not token.special:
                return f"id {idx} is {token.content if token else 'no added token'!r}, expected special {text!r}"
        return ""


def cache_key(name: str, recipe: bytes, inputs: Sequence[bytes | str], layout: Layout) -> str:
    """A content hash of everything a built tokenizer depends on."""
    digest = hashlib.sha256()
    libraries = {lib: version(lib) for lib in LIBRARIES}
    head = [FORMAT_VERSION, name, libraries, layout.vocab_size, sorted(layout.specials.items())]
    for part in [json.dumps(head).encode(), recipe, *(p.encode() if isinstance(p, str) else p for p in inputs)]:
        digest.update(hashlib.sha256(part).digest())  # hashed apart, so no two splits of the bytes collide
    return digest.hexdigest()[:32]


def cached_tokenizer(
    name: str, *, recipe: bytes, inputs: Sequence[bytes | str], layout: Layout, build: Callable[[], Tokenizer]
) -> Tokenizer:
    """The tokenizer `build` makes, loaded from the cache folder when a checked copy is there, else built and
    stored. `recipe` is the source of the code that builds it; `inputs` are the data it reads."""
    folder = settings.cache_folder() / "tokenizers"
    path = folder / f"{name}-{cache_key(name, recipe, inputs, layout)}.json"
    if (cached := _load(path, layout)) is not None:
        return cached
    tokenizer = build()
    if problem := layout.problem(tokenizer):
        raise ValueError(f"built-in tokenizer {name}: {problem}; the package its vocabulary comes from changed")
    _store(tokenizer, path)
    return tokenizer


def _load(path: Path, layout: Layout) -> Tokenizer | None:
    if not path.is_file():
        return None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # any unreadable file (truncated, not JSON, not a tokenizer) is rebuilt
        log.warning("tokenizer cache %s is unreadable (%s); rebuilding it", path, str(e)[:200])
        return None
    if problem := layout.problem(tokenizer):
        log.warning("tokenizer cache %s holds another tokenizer (%s); rebuilding it", path, problem)
        return None
    return tokenizer


def _store(tokenizer: Tokenizer, path: Path) -> None:
    staging = path.with_name(f"{path.name}.{uuid.uuid4().hex}.building")  # unique per writer, same folder
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging.write_text(tokenizer.to_str(), encoding="utf-8")
        os.replace(staging, path)
    except OSError as e:
        log.warning("tokenizer cache %s could not be written (%s); built in memory only", path, e)
        with contextlib.suppress(OSError):
            staging.unlink()
