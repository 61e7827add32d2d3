"""The concurrency engine shared by every backend: adaptive in-flight limit, retries, budgets,
progress, and the durable result log that makes resume exact. Never imports Dagster."""

from eagle_data.runner.estimate import Estimate, estimate_generation
from eagle_data.runner.progress import ShardFigures
from eagle_data.runner.resultlog import ResumeKey, resume_key
from eagle_data.runner.rows import GENERATION_SCHEMA
from eagle_data.runner.run import ShardReport, run_generation
from eagle_data.runner.settings import RunnerSettings

__all__ = [
    "GENERATION_SCHEMA",
    "Estimate",
    "ResumeKey",
    "RunnerSettings",
    "ShardFigures",
    "ShardReport",
    "estimate_generation",
    "resume_key",
    "run_generation",
]
