from pathlib import Path

import pytest

from eagle_data.catalog import CATALOG_PATH, USER_CATALOG_ENV, CatalogError, get_dataset, load_catalog, shard_key

EXPECTED = ["b3_magicoder", "b4_mixturethoughts", "b5_openthoughts", "b6_ultrachat", "b7_sharegpt", "b8_perfectblend"]


def test_the_packaged_catalog_lists_its_six_datasets_in_order(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(USER_CATALOG_ENV, raising=False)  # the package's file, whatever a user adds to it
    assert list(load_catalog(profile="")) == EXPECTED


def test_defaults_apply_and_entries_override_them():
    specs = load_catalog(profile="")
    assert specs["b7_sharegpt"].shard_size == 500
    assert specs["b3_magicoder"].regenerate == "first"
    assert specs["b7_sharegpt"].regenerate == "all"
    assert specs["b6_ultrachat"].adapter.id_field == "prompt_id"


def test_demo_profile_overlays_every_entry(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(USER_CATALOG_ENV, raising=False)
    specs = load_catalog(profile="demo")
    assert {s.source for s in specs.values()} == {"sample"}
    shards = -(-specs["b7_sharegpt"].max_prompts // specs["b7_sharegpt"].shard_size)
    assert all(s.num_shards == shards and s.partition_keys[-1] == shard_key(shards - 1) for s in specs.values())
    assert specs["b7_sharegpt"].generation.thinking is False


def test_adding_a_dataset_is_one_entry(tmp_path: Path):
    text = CATALOG_PATH.read_text() + (
        '\n[datasets.b9_new]\nhub_id = "org/new"\nadapter = { prompt_field = "question" }\nmax_prompts = 1200\n'
    )
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    spec = load_catalog(path, profile="")["b9_new"]
    assert spec.num_shards == 3 and spec.adapter.prompt_field == "question"


@pytest.mark.parametrize("setting", ["shard_size", "canary_prompts"])
def test_bad_entry_names_the_entry_and_the_setting(tmp_path: Path, setting: str):
    path = tmp_path / "catalog.toml"
    path.write_text(f'[datasets.bad]\nadapter = {{ prompt_field = "q" }}\n{setting} = 0\n')
    with pytest.raises(CatalogError, match=rf"catalog entry 'bad': {setting}"):
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


def test_a_user_catalog_file_adds_datasets_and_overrides_packaged_settings(tmp_path: Path, monkeypatch):
    user = tmp_path / "my-catalog.toml"
    user.write_text(
        '[defaults.checks]\nmin_loss_tokens = 4\n'
        '[datasets.b7_sharegpt]\nshard_size = 250\n'
        '[datasets.b9_team]\nhub_id = "org/team"\nadapter = { prompt_field = "question" }\nmax_prompts = 1000\n'
    )
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(user))
    specs = load_catalog(profile="")
    assert list(specs) == [*EXPECTED, "b9_team"]
    assert specs["b7_sharegpt"].shard_size == 250  # overridden
    assert specs["b7_sharegpt"].adapter.id_field == "id"  # the rest of the packaged entry stays
    assert specs["b9_team"].num_shards == 2
    assert {s.checks.min_loss_tokens for s in specs.values()} == {4}
    demo = load_catalog(profile="demo")
    assert demo["b7_sharegpt"].source == "sample" and demo["b7_sharegpt"].shard_size == 250  # the user's key wins
    assert "b9_team" not in demo  # no bundled sample: the demo profile leaves it out


def test_a_missing_or_broken_user_catalog_is_one_line(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(tmp_path / "nope.toml"))
    with pytest.raises(CatalogError, match=r"EAGLE_DATA_CATALOG=.*no such file"):
        load_catalog(profile="")
    broken = tmp_path / "broken.toml"
    broken.write_text("[datasets.b9\n")
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(broken))
    with pytest.raises(CatalogError, match="is not valid TOML"):
        load_catalog(profile="")


def test_only_the_settings_module_reads_the_environment():
    package = Path(__file__).resolve().parents[2] / "eagle_data"
    readers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "os.environ" in path.read_text() or "getenv(" in path.read_text()
    )
    assert readers == ["settings.py"]


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [("datasets.b7_sharegpt.checks", "max_failed_share", "2"), ("defaults.checks", "max_repeat_share", "-0.1"),
     ("datasets.b7_sharegpt.checks", "min_loss_tokens", "-1"), ("datasets.b7_sharegpt", "shard_size", "0")],
)  # fmt: skip
def test_a_share_or_size_out_of_range_in_the_users_file_is_one_line_naming_that_file_and_key(
    tmp_path: Path, monkeypatch, table: str, key: str, value: str
):
    user = tmp_path / "my-catalog.toml"
    user.write_text(f"[{table}]\n{key} = {value}\n")  # e.g. a percent typed for a fraction: 2 for 2 %
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(user))
    with pytest.raises(CatalogError) as err:
        load_catalog(profile="")
    assert f"{key} = {value}: " in str(err.value) and str(err.value).endswith(f"(fix {user})")
    assert "\n" not in str(err.value) and err.value.__cause__ is None and err.value.__suppress_context__


def test_a_bad_value_the_user_file_does_not_set_names_the_packaged_catalog(tmp_path: Path, monkeypatch):
    bad = tmp_path / "catalog.toml"
    bad.write_text(CATALOG_PATH.read_text().replace("max_failed_share = 0.02", "max_failed_share = 2"))
    with pytest.raises(CatalogError, match=rf"checks.max_failed_share = 2: .*\(fix {bad}\)"):
        load_catalog(bad, profile="")


def test_loading_the_definitions_with_a_bad_catalog_prints_its_one_line_without_a_traceback(tmp_path: Path):
    import os
    import subprocess
    import sys

    user = tmp_path / "my-catalog.toml"
    user.write_text("[datasets.b7_sharegpt]\nshard_size = -1\n")
    env = {**os.environ, "EAGLE_DATA_CATALOG": str(user)}
    out = subprocess.run([sys.executable, "-c", "import eagle_data.definitions"], env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"eagle-data: catalog entry 'b7_sharegpt': shard_size = -1: Input should be greater than 0 (fix {user})"
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[datasets."../../.."]\nhub_id = "org/x"\nadapter = { prompt_field = "q" }\n', "name = '../../..': "),
        ("[datasets.b7_sharegpt]\nmix_weight = 1e308\n", "mix_weight = 1e+308: "),
        ("[datasets.b7_sharegpt]\nmax_turns = 100000\n", "max_turns = 100000: "),
        ('[[datasets.b7_sharegpt.generation.mixture]]\nname = "hot"\nweight = -1\n', "mixture.0.weight = -1: "),
    ],
    ids=["path_name", "huge_weight", "huge_turns", "mixture_weight"],
)
def test_names_and_magnitudes_are_checked_at_load_naming_the_users_file(
    tmp_path: Path, monkeypatch, text: str, said: str
):
    """#34.8: `../../..` ended in a 95-line Dagster error, 1e308 and 100000 were accepted, and a mixture's error
    named the packaged catalog."""
    user = tmp_path / "my-catalog.toml"
    user.write_text(text)
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(user))
    with pytest.raises(CatalogError) as err:
        load_catalog(profile="")
    assert said in str(err.value) and str(err.value).endswith(f"(fix {user})") and "\n" not in str(err.value)


def test_a_profile_never_overrides_a_key_the_users_catalog_sets(tmp_path: Path, monkeypatch):
    """#34.8: under EAGLE_DATA_PROFILE=demo a user's `target = "auto"` became the profile's "demo" without a word."""
    user = tmp_path / "my-catalog.toml"
    user.write_text('[defaults]\nshard_size = 20\n[datasets.b7_sharegpt]\ntarget = "qwen3-test"\n')
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(user))
    specs = load_catalog(profile="demo")
    assert specs["b7_sharegpt"].target == "qwen3-test" and specs["b3_magicoder"].target == "auto"
    assert {s.shard_size for s in specs.values()} == {20}  # the user's defaults win over the profile too
    assert specs["b7_sharegpt"].source == "sample"  # what the user does not set, the profile still sets


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[automation]\nvalidated_fail_after_hours = inf\n",
         "[automation] validated_fail_after_hours = inf: Input should be less than or equal to 8784"),
        ('[drafter.capture]\nformats = ["specforge"]\n', "[drafter] capture.formats.0 = 'specforge': Input should be "),
        ("[exports]\nformats = []\n", "[exports] formats = []: choose at least one of specforge_prompts"),
        ("[drafter.capture]\nlayers = []\n", "[drafter.capture] layers: name distinct decoder-layer ids >= 0"),
        ('[exports]\nformats = ["parquet"]\n', "[exports] formats: unknown parquet; known: specforge_prompts"),
    ],
    ids=["inf_hours", "unknown_capture_format", "no_export_format", "no_layers", "unknown_export_format"],
)  # fmt: skip
def test_a_bad_value_of_any_table_stops_the_code_location_load_in_one_line_naming_the_users_file(
    tmp_path: Path, text: str, said: str
):
    """Issue 43.6: `inf` hours was a 73-line OverflowError and an unknown capture format a 92-line chained traceback
    when the code location loaded; `formats = []` a green run that set prompts.jsonl aside; `layers = []` a capture
    that failed its check; and every [exports]/[drafter] error named the packaged catalog.toml."""
    import os
    import subprocess
    import sys

    user = tmp_path / "my-catalog.toml"
    user.write_text(text)
    env = {**os.environ, "EAGLE_DATA_CATALOG": str(user)}
    out = subprocess.run([sys.executable, "-c", "import eagle_data.definitions"], env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith(f"eagle-data: {said}") and line.endswith(f"(fix {user})"), line


def test_every_table_of_the_catalog_is_read_through_one_loader():
    """One home: only catalog.py reads the catalog's files; the other rooms read its validated model (before, the
    drafter, exports and automation tables each read the files again)."""
    package = Path(__file__).resolve().parents[2] / "eagle_data"
    readers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if "CATALOG_PATH" in p.read_text())
    assert readers == ["catalog.py"]


def test_a_dataset_without_a_bundled_sample_loads_and_the_demo_profile_leaves_it_out_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):

    user = tmp_path / "catalog.toml"
    user.write_text('[datasets.b9_extra]\nhub_id = "org/extra"\nadapter = { messages_field = "messages" }\n'
                    f'[datasets.b9_own]\nhub_id = "org/own"\nsource = "{tmp_path / "own.jsonl"}"\n'
                    'adapter = { messages_field = "messages" }\n')  # fmt: skip
    monkeypatch.setenv(USER_CATALOG_ENV, str(user))
    assert {"b9_extra", "b9_own"} <= set(load_catalog(profile=""))
    demo = load_catalog(profile="demo")
    assert "b9_extra" not in demo and demo["b9_own"].source == str(tmp_path / "own.jsonl")  # its own source: kept
    monkeypatch.setenv("EAGLE_DATA_PROFILE", "demo")  # the catalog is read once per profile and user file
    with pytest.raises(CatalogError, match=r"^dataset 'b9_extra' has no bundled sample .*b9_extra\.jsonl\), so the "
                       r"demo profile leaves it out: set `source` in its catalog entry") as caught:  # fmt: skip
        get_dataset("b9_extra")
    assert "\n" not in str(caught.value)
