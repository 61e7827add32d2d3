"""Read a prompt source (the hub, a local or S3 parquet/JSONL file, or the bundled sample), normalize it.

Every row becomes a conversation `[{role, content}]` with roles system/user/assistant, a stable
`prompt_id` (hash of dataset + normalized messages), or a counted skip reason. The normalized,
de-duplicated, capped list is the *prompt index*: shard `i` is rows `[i*shard_size, (i+1)*shard_size)`.

The index is built streaming (the source read in batches, rows normalized one batch at a time, written
one block of `shard_size` rows at a time), so memory stays flat whatever the source's size, and a
one-shard run reads only its own block. It is saved next to the shards and keyed by the source's
content (a local file's size, mtime and SHA-256; an S3 object's ETag; a hub dataset's revision): the
same content always gives the same shards (resume depends on that), and a changed source rebuilds it.
"""

from eagle_data.sources.index import IndexSummary, PromptIndex, build_index, check_yield, load_index
from eagle_data.sources.prompts import MESSAGES_SCHEMA, PROMPTS_SCHEMA, BadRow, SourceError, normalize, prompt_id
from eagle_data.sources.readers import Source, source_location

__all__ = [
    "MESSAGES_SCHEMA",
    "PROMPTS_SCHEMA",
    "BadRow",
    "IndexSummary",
    "PromptIndex",
    "Source",
    "SourceError",
    "build_index",
    "check_yield",
    "load_index",
    "normalize",
    "prompt_id",
    "source_location",
]
