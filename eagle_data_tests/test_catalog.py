from pathlib import Path

import pytest

from eagle_data.catalog import CATALOG_PATH, CatalogError, get_dataset, load_catalog, shard_key

EXPECTED = ["b3_magicoder", "b4_mixturethoughts", "b5_openthoughts", "b6_ultrachat", "b7_sharegpt", "b8_perfectblend"]


def test_catalog_lists_the_six_datasets_in_order():
    assert list(load_catalog(profile="")) == EXPECTED


def test_defaults_apply_and_entries_override_them():
    specs = load_catalog(profile="")
    assert specs["b7_sharegpt"].shard_size == 500
    assert specs["b3_magicoder"].regenerate == "first"
    assert specs["b7_sharegpt"].regenerate == "all"
    assert specs["b6_ultrachat"].adapter.id_field == "prompt_id"


def test_demo_profile_overlays_every_entry():
    specs = load_catalog(profile="demo")
    assert {s.source for s in specs.values()} == {"sample"}
    assert all(s.num_shards == 4 and s.partition_keys[-1] == shard_key(3) for s in specs.values())
    assert specs["b7_sharegpt"].generation.thinking is False


def test_adding_a_dataset_is_one_entry(tmp_path: Path):
    text = CATALOG_PATH.read_text() + (
        '\n[datasets.b9_new]\nhub_id = "org/new"\nadapter = { prompt_field = "question" }\nmax_prompts = 1200\n'
    )
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    spec = load_catalog(path, profile="")["b9_new"]
    assert spec.num_shards == 3 and spec.adapter.prompt_field == "question"


def test_bad_entry_names_the_entry_and_the_setting(tmp_path: Path):
    path = tmp_path / "catalog.toml"
    path.write_text('[datasets.bad]\nadapter = { prompt_field = "q" }\nshard_size = 0\n')
    with pytest.raises(CatalogError, match=r"catalog entry 'bad': shard_size"):
        load_catalog(path, profile="")


def test_unknown_dataset_is_a_one_line_error():
    with pytest.raises(CatalogError) as err:
        get_dataset("b99_nothing")
    message = str(err.value)
    assert "b99_nothing" in message and "b7_sharegpt" in message and "\n" not in message


def test_unknown_profile_is_refused():
    with pytest.raises(CatalogError, match="unknown profile 'nope'"):
        load_catalog(profile="nope")


def test_cli_names_an_unknown_dataset_in_one_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "eagle_data.cli", "demo", "--dataset", "b99_nope"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("eagle-data: unknown dataset 'b99_nope'") and out.stderr.count("\n") == 1
