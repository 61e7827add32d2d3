"""The Dagster layer: assets, checks, resources, sensors and schedules built from the catalog.

Thin by design: everything here wires the pure rooms (sources, runner, targets, quality, storage).
"""
