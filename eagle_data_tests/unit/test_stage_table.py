"""The stage table is the one home of what a stage reads: every catalog setting that changes generation output is
in the resume key, derived from the catalog model (not a hand list that could drift)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from eagle_data.catalog import DatasetSpec, Generation, SamplingSetting
from eagle_data.runner.resultlog import resume_key
from eagle_data.stage_table import DATASET_STAGES, GENERATION, STAGES, asset_of
from eagle_data.standins.openai_fake import spec_for_tests

ENGINE = {"model": "m", "max_tokens": 64}


def changed(value: Any, annotation: Any) -> Any:
    """Another valid value of a setting's type, whatever the setting: the test follows the model's fields."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.5
    if isinstance(value, str) or (value is None and "str" in str(annotation)):
        return {"all": "first", "first": "all"}.get(value or "", f"{value or ''}x")
    if isinstance(value, tuple) and "SamplingSetting" in str(annotation):
        return (*value, SamplingSetting(name=f"s{len(value)}", weight=1.0, temperature=0.1))
    if isinstance(value, tuple):
        return (*value, "team:other")
    if isinstance(value, BaseModel):  # the first of its fields whose change is still a valid model
        for name, info in type(value).model_fields.items():
            try:
                return type(value).model_validate({**value.model_dump(), name: changed(getattr(value, name),
                                                                                      info.annotation)})  # fmt: skip
            except (ValueError, AssertionError):
                continue
    raise AssertionError(f"no changed value for {value!r} ({annotation}): teach `changed` this setting's type")


def with_setting(spec: DatasetSpec, name: str) -> DatasetSpec:
    updated = spec.model_copy(update={name: changed(getattr(spec, name), DatasetSpec.model_fields[name].annotation)})
    return DatasetSpec.model_validate(updated.model_dump())  # validated: the changed value is a real setting


@pytest.mark.parametrize("field", sorted(Generation.model_fields))
def test_every_generation_setting_changes_the_resume_key_and_the_generation_code_version(field: str) -> None:
    spec = spec_for_tests()
    other = spec.model_copy(update={"generation": spec.generation.model_copy(update={
        field: changed(getattr(spec.generation, field), Generation.model_fields[field].annotation)})})  # fmt: skip
    other = DatasetSpec.model_validate(other.model_dump())
    assert resume_key(ENGINE, other).config_hash != resume_key(ENGINE, spec).config_hash
    assert GENERATION.version(other) != GENERATION.version(spec)


@pytest.mark.parametrize("name", GENERATION.settings)
def test_every_setting_of_the_generation_stage_is_in_the_resume_key(name: str) -> None:
    spec = spec_for_tests()
    other = with_setting(spec, name)
    assert resume_key(ENGINE, other).config_hash != resume_key(ENGINE, spec).config_hash
    assert GENERATION.version(other) != GENERATION.version(spec)


def test_a_setting_generation_does_not_read_leaves_the_resume_key_alone() -> None:
    spec = spec_for_tests()
    unread = sorted(set(DatasetSpec.model_fields) - set(GENERATION.settings) - {"name"})
    for name in unread:
        other = with_setting(spec, name)
        assert resume_key(ENGINE, other) == resume_key(ENGINE, spec), name


def test_the_table_names_only_catalog_settings_and_stages_it_holds() -> None:
    names = {stage.name for stage in STAGES}
    assert len(names) == len(STAGES)
    for stage in STAGES:
        assert set(stage.settings) <= set(DatasetSpec.model_fields), stage.name
        assert {stage.reads, *stage.after} - {""} <= names, stage.name
    assert [s.tag for s in STAGES] == sorted(s.tag for s in STAGES)  # the tags sort in flow order
    assert [asset_of(s.name, "b9") for s in DATASET_STAGES] == ["b9_prompts", "b9_estimate", "b9", "b9_validated"]
