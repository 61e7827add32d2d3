"""Drafter-ready outputs built from the training data (pure: no Dagster here).

Rooms: `settings` (the catalog's `[drafter]` table), `vocab` (token frequencies and the EAGLE-3 draft
vocabulary mapping), `mixfile` (reading the training mix streaming), `hidden_states` (the capture's plan:
bytes and GPU-hours), `capture` (the target's hidden states over the mix, by shard, behind a backend
protocol), `layers` (EAGLE-3 / DFlash presets), `formats` (the layouts trainers load), `verify` (the
capture's checks). The drafter's stages over the store (`eagle_data/stages/draft_vocab.py`, `hidden_states.py`)
call them; `eagle_data/defs/drafter.py` wires those as assets. Benchmark decontamination, a quality gate, is in
`eagle_data/quality/decontam.py`.
"""
