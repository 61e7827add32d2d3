"""Target-model profiles: tokenizers, chat formats, token ids and loss masks."""
