"""Drafter-ready outputs built from the training data (pure: no Dagster here).

Rooms: `settings` (the catalog's `[drafter]` table), `vocab` (token frequencies and the EAGLE-3 draft
vocabulary mapping), `mixfile` (reading the training mix streaming). `eagle_data/defs/drafter.py` wires
them as assets.
"""
