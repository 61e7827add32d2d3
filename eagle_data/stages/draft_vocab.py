"""The EAGLE-3 draft vocabulary: the mix's supervised-token counts, and one mapping per draft vocabulary size
in the files the chosen trainers load."""

from __future__ import annotations

from typing import Any

from eagle_data import layout
from eagle_data.catalog import DatasetSpec
from eagle_data.drafter import trainers, vocab
from eagle_data.drafter.mixfile import exported_file, mix_target
from eagle_data.report import Log
from eagle_data.storage import ShardStore
from eagle_data.targets import load_target


def write_draft_vocab(
    specs: list[DatasetSpec],
    store: ShardStore,
    sizes: tuple[int, ...],
    log: Log = print,
    formats: tuple[str, ...] = ("specforge-eagle3",),
) -> dict[str, Any]:
    """Count the mix's supervised tokens (once per tokenizer and mix content) and write one EAGLE-3 mapping
    per draft vocabulary size, in the files the chosen trainers (`formats`) load, skipping those already
    written; returns the figures, per size the share of supervised tokens the draft vocabulary covers and
    the SpecForge file's URI (the others lie beside it)."""
    with exported_file(store, layout.mix()) as (path, found):
        target = load_target(mix_target(path, specs))
        mix_hash = found.sha256
        freq_key = layout.draft_vocab_file(target.tokenizer_hash, mix_hash, layout.TOKEN_FREQ_FILE)
        counted = not store.exists(freq_key)
        if counted:
            counts = vocab.count_supervised(path, target.vocab_size)
            store.write_bytes(freq_key, vocab.token_freq_bytes(counts))
        else:
            counts = vocab.counts_from_token_freq(store.read_bytes(freq_key), target.vocab_size)
    figures: dict[str, Any] = {
        "target": target.name,
        "target_vocab_size": target.vocab_size,
        "tokenizer_hash": target.tokenizer_hash,
        "mix_hash": mix_hash,
        "supervised_tokens": int(counts.sum()),
        "distinct_supervised_ids": int((counts > 0).sum()),
        "counted": counted,
        "token_freq_path": store.uri(freq_key),
    }
    for size in sizes:
        draft = vocab.draft_vocab(counts, size)
        names = trainers.vocab_names(formats, size)
        keys = {name: layout.draft_vocab_file(target.tokenizer_hash, mix_hash, name) for name in names}
        missing = [name for name, key in keys.items() if not store.exists(key)]
        for name, data in vocab.mapping_files(draft, missing).items():
            store.write_bytes(keys[name], data)
        figures[f"coverage_{size}"] = round(draft.coverage, 6)
        figures[f"mapping_{size}_path"] = store.uri(keys[layout.vocab_mapping_name(size)])
        log(f"draft vocabulary {size}: covers {draft.coverage:.2%} of supervised tokens -> {', '.join(keys)}")
    return figures
