"""The storage layout: every key under the output root is built and parsed here, nowhere else.

Keys are relative paths under the root (a folder or `s3://bucket/prefix`):

| kind | key |
| --- | --- |
| shard | `{ds}/{asset}/{partition}.parquet` (`asset`: `{ds}_prompts`, `{ds}`, `{ds}_validated`) |
| log_part | `{ds}/{ds}/_log/{partition}/part-{ns}-{pid}-{seq}.parquet` (generation's durable result log) |
| turn_log | `{ds}/{ds}/_log/{partition}/turns-{run}.jsonl` (folder: appended) or `turns-{run}.{seq}.jsonl` (S3 parts) |
| turn_carry | `{ds}/{ds}/_log/{partition}/carry-{run}.jsonl` (turns of conversations a shard left unfinished) |
| lease | `{ds}/{ds}/_lease/{partition}/{generation:08d}.json` (the one run generating the shard) |
| usage | `{ds}/{ds}/_usage/{partition}.json` (tokens and dollars of a finished generation shard) |
| kept | `{ds}/{ds}/_log/{partition}/kept.parquet` (a stored generation shard's rows, kept to rebuild it unpaid) |
| digest | `{ds}/{asset}/_digest/{partition}.json` (sha256 and size of a prompts or generation shard as stored) |
| index | `{ds}/{ds}_prompts/_index/summary.json` (the saved prompt index: counts, source identity) |
| index_block | `{ds}/{ds}_prompts/_index/{digest}/{block}.parquet` (its rows, one block per shard) |
| quality | `{ds}/{ds}_quality/{partition}.json` / `{partition}.html` / `index.html` (quality report) |
| judged | `{ds}/{ds}_quality/_judged/{partition}/{check}.json` (a check judged after validation, on its own) |
| export | `{ds}/export/{name}` (`train.parquet`, and each chosen trainer file: `prompts.jsonl` ...) |
| mix | `training_mix/training_mix/mix.parquet`, and beside it the mix's trainer files (`prompts.jsonl`) |
| export record | `training_mix/training_mix/_written.json` (sha256 and size of every file the last export wrote) |
| drafter | `drafter/{asset}/{name}`; draft vocabulary files: `drafter/draft_vocab/{tokenizer}-{mix hash}/{name}` |
| write check | `{ds}/.write-check-{token}` (written and deleted at once by the pre-flight; hidden from listings) |

A key parses back into a `Key` naming its kind and parts, so code that lists a folder never splits
paths itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal[
    "shard",
    "log_part",
    "turn_log",
    "turn_carry",
    "lease",
    "usage",
    "kept",
    "digest",
    "index",
    "index_block",
    "quality_record",
    "quality_page",
    "quality_index",
    "judged",
    "export",
    "mix",
    "drafter",
]

SEP = "/"
SHARD_SUFFIX = ".parquet"
LOG_DIR = "_log"
USAGE_DIR = "_usage"
DIGEST_DIR = "_digest"
KEPT_FILE = "kept.parquet"
EXPORT_RECORD = "_written.json"
LEASE_DIR = "_lease"
JUDGED_DIR = "_judged"
INDEX_DIR = "_index"
EXPORT_DIR = "export"
QUALITY_INDEX = "index.html"
MIX_DATASET = MIX_ASSET = "training_mix"
MIX_FILE = "mix.parquet"
CONVERSATIONS_FILE = "conversations.jsonl"
TRAIN_FILE = "train.parquet"
DRAFTER_DIR = "drafter"
DRAFT_VOCAB_ASSET = "draft_vocab"
TOKEN_FREQ_FILE = "token_freq.pt"
HIDDEN_STATES_ASSET = "hidden_states"
_PART = re.compile(r"part-(\d+)-(\d+)-(\d+)\.parquet")
_TURNS = re.compile(r"turns-([\w-]+)(\.\d+)?\.jsonl")
_CARRY = re.compile(r"carry-([\w-]+)\.jsonl")
_LEASE = re.compile(r"\d{8}\.json")
_RUN = re.compile(r"[\w-]+")


# ---- asset names (they are folder names too) ------------------------------------------------------
def prompts_asset(dataset: str) -> str:
    return f"{dataset}_prompts"


def estimate_asset(dataset: str) -> str:
    return f"{dataset}_estimate"


def generation_asset(dataset: str) -> str:
    return dataset


def validated_asset(dataset: str) -> str:
    return f"{dataset}_validated"


def quality_folder(dataset: str) -> str:
    return f"{dataset}_quality"


# ---- builders -------------------------------------------------------------------------------------
def join(*parts: str) -> str:
    """A key from its parts; empty parts are left out."""
    return SEP.join(p.strip(SEP) for p in parts if p.strip(SEP))


def under(root: str, key: str) -> str:
    """The URI of `key` under a root (a folder path or `s3://bucket/prefix`; "" for a bare bucket)."""
    return f"{root.rstrip(SEP)}{SEP}{key}" if root else key


def asset_prefix(dataset: str, asset: str) -> str:
    """The folder of an asset's shards (list it to find them)."""
    return join(dataset, asset)


def shard(dataset: str, asset: str, partition: str) -> str:
    return join(dataset, asset, partition + SHARD_SUFFIX)


def log_prefix(dataset: str, partition: str) -> str:
    return join(dataset, generation_asset(dataset), LOG_DIR, partition)


def log_part(dataset: str, partition: str, stamp_ns: int, pid: int, seq: int) -> str:
    """One checkpoint part; names sort by time of writing."""
    return join(log_prefix(dataset, partition), f"part-{stamp_ns:020d}-{pid}-{seq:06d}.parquet")


def turn_log(dataset: str, partition: str, run: str, seq: int | None = None) -> str:
    """One run's turn log of a shard: one appended file, or (`seq`) one part object per flush."""
    _check_run(run)
    name = f"turns-{run}.jsonl" if seq is None else f"turns-{run}.{seq:06d}.jsonl"
    return join(log_prefix(dataset, partition), name)


def turn_carry(dataset: str, partition: str, run: str) -> str:
    _check_run(run)
    return join(log_prefix(dataset, partition), f"carry-{run}.jsonl")


def lease_prefix(dataset: str, partition: str) -> str:
    return join(dataset, generation_asset(dataset), LEASE_DIR, partition)


def lease(dataset: str, partition: str, generation: int) -> str:
    return join(lease_prefix(dataset, partition), f"{generation:08d}.json")


def lease_generation(key: str) -> int:
    """The generation a lease key names."""
    parsed = parse(key)
    if parsed is None or parsed.kind != "lease":
        raise ValueError(f"not a lease key: {key!r}")
    return int(parsed.name.removesuffix(".json"))


def _check_run(run: str) -> None:
    if not _RUN.fullmatch(run):
        raise ValueError(f"run id {run!r} must be letters, digits, '_' or '-' (it names files)")


def write_check(dataset: str, token: str) -> str:
    return join(dataset, f".write-check-{token}")


def usage(dataset: str, partition: str) -> str:
    return join(dataset, generation_asset(dataset), USAGE_DIR, partition + ".json")


def kept(dataset: str, partition: str) -> str:
    """The kept copy of a stored generation shard's rows (resultlog.ResultLog.commit_handed)."""
    return join(log_prefix(dataset, partition), KEPT_FILE)


def digest_record(dataset: str, asset: str, partition: str) -> str:
    """The digest record of a prompts or generation shard (storage.digests)."""
    return join(dataset, asset, DIGEST_DIR, partition + ".json")


def export_record() -> str:
    """The digests of every file the last export wrote (storage.digests)."""
    return mix_file(EXPORT_RECORD)


def index_prefix(dataset: str) -> str:
    return join(dataset, prompts_asset(dataset), INDEX_DIR)


def index_file(dataset: str, name: str) -> str:
    return join(index_prefix(dataset), name)


def index_block(dataset: str, digest: str, block: int) -> str:
    """Block `block` of the index built from the source content and settings hashed in `digest`."""
    return join(index_prefix(dataset), digest, f"{block:05d}{SHARD_SUFFIX}")


def quality_prefix(dataset: str) -> str:
    return join(dataset, quality_folder(dataset))


def quality_record(dataset: str, partition: str) -> str:
    return join(quality_prefix(dataset), partition + ".json")


def quality_page(dataset: str, partition: str) -> str:
    return join(quality_prefix(dataset), partition + ".html")


def quality_index(dataset: str) -> str:
    return join(quality_prefix(dataset), QUALITY_INDEX)


def judged_prefix(dataset: str, partition: str) -> str:
    return join(quality_prefix(dataset), JUDGED_DIR, partition)


def judged_outcome(dataset: str, partition: str, check: str) -> str:
    return join(judged_prefix(dataset, partition), check + ".json")


def export_file(dataset: str, name: str) -> str:
    return join(dataset, EXPORT_DIR, name)


def mix() -> str:
    return mix_file(MIX_FILE)


def mix_file(name: str) -> str:
    """A file of the training mix: `mix.parquet`, or a trainer file of the whole mix."""
    return join(MIX_DATASET, MIX_ASSET, name)


def drafter_file(asset: str, name: str) -> str:
    """A file of a drafter-input asset (`drafter/{asset}/{name}`)."""
    return join(DRAFTER_DIR, asset, name)


def draft_vocab_file(tokenizer_hash: str, mix_hash: str, name: str) -> str:
    """A draft-vocabulary file in the cache folder of one (target tokenizer, mix content) pair."""
    return join(DRAFTER_DIR, DRAFT_VOCAB_ASSET, f"{tokenizer_hash[:16]}-{mix_hash[:16]}", name)


def capture_dir(capture_id: str) -> str:
    """The folder of one hidden-state capture (one checkpoint, layers, dtype and tokenizer): its formats'
    files and, per shard, `_shards/{partition}.json` (provenance) and `_progress/{partition}.json`."""
    return join(DRAFTER_DIR, HIDDEN_STATES_ASSET, capture_id)


def capture_record(capture_id: str, kind: str, partition: str) -> str:
    return join(capture_dir(capture_id), f"_{kind}", f"{partition}.json")


def vocab_mapping_name(size: int) -> str:
    return f"vocab_mapping_{size}.pt"


def s3_root(root: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> (bucket, prefix); bucket is "" when the URI names none."""
    bucket, _, prefix = root.removeprefix("s3://").partition(SEP)
    return bucket, prefix.strip(SEP)


# ---- parser ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Key:
    """A parsed key: its kind and the parts it was built from ("" where a kind has no such part)."""

    kind: Kind
    dataset: str
    asset: str = ""
    partition: str = ""
    name: str = ""


def parse(key: str) -> Key | None:
    """The kind and parts of a key built by this module; None for anything else (temp files, strays)."""
    parts = key.strip(SEP).split(SEP)
    if len(parts) < 3:
        return None
    dataset, folder, rest = parts[0], parts[1], parts[2:]
    if key.strip(SEP) == mix():
        return Key("mix", MIX_DATASET, MIX_ASSET, name=MIX_FILE)
    if dataset == DRAFTER_DIR:
        return Key("drafter", DRAFTER_DIR, folder, partition=SEP.join(rest[:-1]), name=rest[-1])
    if folder == EXPORT_DIR and len(rest) == 1:
        return Key("export", dataset, name=rest[0])
    if folder == quality_folder(dataset) and rest[0] == JUDGED_DIR and len(rest) == 3 and rest[2].endswith(".json"):
        return Key("judged", dataset, folder, partition=rest[1], name=rest[2])
    if folder == quality_folder(dataset) and len(rest) == 1:
        if rest[0] == QUALITY_INDEX:
            return Key("quality_index", dataset, name=rest[0])
        stem, dot, ext = rest[0].rpartition(".")
        kinds: dict[str, Kind] = {"json": "quality_record", "html": "quality_page"}
        return Key(kinds[ext], dataset, partition=stem, name=rest[0]) if dot and ext in kinds else None
    if folder == prompts_asset(dataset) and rest[0] == INDEX_DIR and len(rest) == 2:
        return Key("index", dataset, folder, name=rest[1])
    if folder == prompts_asset(dataset) and rest[0] == INDEX_DIR and len(rest) == 3 and rest[2].endswith(SHARD_SUFFIX):
        return Key("index_block", dataset, folder, partition=rest[2].removesuffix(SHARD_SUFFIX), name=rest[1])
    if folder == generation_asset(dataset) and rest[0] == LOG_DIR and len(rest) == 3:
        log_kinds: tuple[tuple[Kind, re.Pattern[str]], ...] = (
            ("log_part", _PART), ("turn_log", _TURNS), ("turn_carry", _CARRY)
        )  # fmt: skip
        if rest[2] == KEPT_FILE:
            return Key("kept", dataset, folder, partition=rest[1], name=rest[2])
        kind = next((k for k, pattern in log_kinds if pattern.fullmatch(rest[2])), None)
        return Key(kind, dataset, folder, partition=rest[1], name=rest[2]) if kind else None
    if folder == generation_asset(dataset) and rest[0] == LEASE_DIR and len(rest) == 3 and _LEASE.fullmatch(rest[2]):
        return Key("lease", dataset, folder, partition=rest[1], name=rest[2])
    if folder == generation_asset(dataset) and rest[0] == USAGE_DIR and len(rest) == 2 and rest[1].endswith(".json"):
        return Key("usage", dataset, folder, partition=rest[1].removesuffix(".json"), name=rest[1])
    if rest[0] == DIGEST_DIR and len(rest) == 2 and rest[1].endswith(".json"):
        return Key("digest", dataset, folder, partition=rest[1].removesuffix(".json"), name=rest[1])
    if len(rest) == 1 and rest[0].endswith(SHARD_SUFFIX) and not rest[0].startswith("."):
        return Key("shard", dataset, folder, partition=rest[0].removesuffix(SHARD_SUFFIX))
    return None
