"""The names README and docs/ list are the code's names, in both directions.

Each test collects a set of names from the code (the Definitions object, the engine registry, the target
profiles, the catalog models, the environment variables the code reads, the frame schemas) and the names a
doc table or contract lists, and requires them equal: a name added to the code and not documented fails,
and so does a documented name the code renamed or removed. The Definitions are built once, in-process.
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from pydantic import BaseModel

from eagle_data import catalog, engines
from eagle_data.defs.automation import AutomationSettings
from eagle_data.drafter import settings as drafter
from eagle_data.quality import evalsets, registry
from eagle_data.runner.rows import GENERATION_SCHEMA
from eagle_data.sources import PROMPTS_SCHEMA
from eagle_data.stage_table import DATASET_STAGES
from eagle_data.stages.validation import validated_rows
from eagle_data.targets.profile import read_profiles

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"
# Variables the settings table lists that other libraries read (boto3 reads the AWS ones), not this code.
THIRD_PARTY_ENV = {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def tables(path: Path) -> Iterator[list[dict[str, str]]]:
    """Every Markdown table of a file, as rows keyed by the lower-cased header cells."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            header = [c.strip().lower() for c in lines[i].strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(header, (c.strip() for c in lines[i].strip("|").split("|")), strict=False)))
                i += 1
            yield rows
        else:
            i += 1


def table(path: Path, *header: str) -> list[dict[str, str]]:
    """The one table of `path` whose first header cells are `header`."""
    found = [rows for rows in tables(path) if rows and tuple(rows[0])[: len(header)] == header]
    assert len(found) == 1, f"{path.name}: expected one table headed {header}, found {len(found)}"
    return found[0]


def names(text: str) -> list[str]:
    """The backticked names in a cell or paragraph (`x`, `{ds}_prompts`, `kimi-k2.5`)."""
    return re.findall(r"`([{}A-Za-z0-9_.\-]+)`", text)


def contract(kind: str) -> str:
    """The text of one `- **kind**:` bullet under docs/design.md's Data contracts."""
    text = DESIGN.read_text()
    match = re.search(rf"^- \*\*{kind}\*\*:(.*?)(?=^- \*\*|^#)", text, re.S | re.M)
    assert match, f"docs/design.md has no '- **{kind}**:' contract"
    return match.group(1)


def fields(model: type[BaseModel], *nested: str) -> set[str]:
    return set(model.model_fields) - set(nested)


@pytest.fixture(scope="module")
def graph() -> Any:
    from eagle_data.definitions import defs

    return defs.resolve_asset_graph()


@pytest.fixture(scope="module")
def datasets() -> list[str]:
    return list(catalog.catalog())


def pattern(name: str, datasets: list[str]) -> str:
    """An asset or group name with its dataset written `{ds}`, as the docs write it."""
    for ds in sorted(datasets, key=len, reverse=True):
        if name == ds or name.startswith(ds + "_"):
            return "{ds}" + name[len(ds) :]
    return name


def test_design_asset_table_lists_every_asset_with_its_group_stage_and_partitioning(graph: Any, datasets: list[str]):
    code = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        group, partitioned = pattern(node.group_name, datasets), node.partitions_def is not None
        code[pattern(key.to_user_string(), datasets)] = (group, node.tags["stage"], partitioned)
    doc = {
        names(row["asset"])[0]: (names(row["group"])[0], names(row["stage"])[0], row["partitioned"] == "yes")
        for row in table(DESIGN, "asset", "group", "stage", "partitioned")
    }
    assert doc == code


def test_design_check_table_lists_every_check_on_its_asset_with_its_blocking_flag(graph: Any, datasets: list[str]):
    code = {
        (key.name, pattern(key.asset_key.to_user_string(), datasets), registry.check(key.name).blocking)
        for key in graph.asset_check_keys  # the estimate's two block by generation's refusal, not a Dagster skip
    }
    rows = table(DESIGN, "check", "asset", "blocking")
    doc = {(names(r["check"])[0], names(r["asset"])[0], r["blocking"].split()[0] == "yes") for r in rows}
    assert doc == code
    settings = fields(catalog.DatasetSpec) | fields(catalog.Checks)
    cited = {name for r in rows for name in names(r["judged against"])}
    assert cited <= settings, f"the check table cites settings the catalog lacks: {sorted(cited - settings)}"


def test_readme_and_design_name_every_stage_tag(graph: Any):
    code = {graph.get(key).tags["stage"] for key in graph.get_all_asset_keys()}
    for path in (README, DESIGN):
        assert set(re.findall(r"`(\d-[a-z]+)`", path.read_text())) == code, f"{path.name} lists other stage tags"


def test_design_lists_every_sensor_and_schedule_with_its_default_status(datasets: list[str]):
    from eagle_data.definitions import defs

    code = {pattern(s.name, datasets): s.default_status.value.lower() for s in [*defs.sensors, *defs.schedules]}
    doc = {names(r["sensor or schedule"])[0]: r["default"] for r in table(DESIGN, "sensor or schedule", "default")}
    assert doc == code


def test_prose_counts_of_assets_match_the_definitions(graph: Any, datasets: list[str]):
    """The README counts assets per dataset (from the stage table), never the datasets or the checks: adding a
    dataset or a check changes no sentence."""
    keys = [k.to_user_string() for k in graph.get_all_asset_keys()]
    dataset_assets = [k for k in keys if pattern(k, datasets) != k]
    drafter = [k for k in graph.get_all_asset_keys() if graph.get(k).group_name == "drafter"]
    listed = re.search(r"# (\d+) assets per dataset, training_mix, (\d+) drafter inputs", README.read_text())
    assert listed, "README's `dagster asset list` comment no longer counts the assets"
    assert (int(listed[1]), int(listed[2])) == (len(dataset_assets) // len(datasets), len(drafter))
    assert len(dataset_assets) == len(DATASET_STAGES) * len(datasets)


def builtin_kinds() -> dict[str, engines.EngineKind]:
    """The project's engine kinds (a test module may register its own, e.g. test_engine_registry's echo)."""
    return {name: kind for name, kind in engines.kinds().items() if kind.make.__module__.startswith("eagle_data.")}


def test_engines_doc_lists_every_kind_with_its_key_variable_pool_and_in_flight_ceiling():
    code = {
        name: (kind.key_env or "none", kind.pool_name, kind.max_in_flight, kind.ramp)
        for name, kind in builtin_kinds().items()
    }
    doc = {}
    for row in table(ROOT / "docs" / "engines.md", "kind", "module", "key variable", "pool", "in flight"):
        key = row["key variable"].split()[0].strip("`")
        ceiling = int(row["in flight"].split(",")[0])
        doc[names(row["kind"])[0]] = (key, names(row["pool"])[0], ceiling, "no ramp" not in row["in flight"])
    assert doc == code
    kinds = re.search(r"^\| `EAGLE_DATA_ENGINE` \|([^|]*)\|", README.read_text(), re.M)
    assert kinds, "README's settings table lost EAGLE_DATA_ENGINE"
    assert set(names(kinds[1])) == set(builtin_kinds()), "README's EAGLE_DATA_ENGINE row lists other kinds"


def test_engines_doc_lists_every_engine_resource_field():
    from eagle_data.defs.resources import EngineResource

    listed = re.search(
        r"`EngineResource` has one optional field per setting \(([^)]*)\)", (ROOT / "docs" / "engines.md").read_text()
    )
    assert listed, "docs/engines.md no longer lists EngineResource's fields"
    assert set(names(listed[1])) == set(EngineResource.model_fields)


def test_targets_doc_lists_every_profile():
    code = set(read_profiles())
    doc = {name for row in table(ROOT / "docs" / "targets.md", "profile") for name in names(row["profile"])}
    assert code and doc == code


def test_breaker_doc_lists_every_gate_with_its_setting_and_warning_flag():
    from eagle_data.runner.breaker import GATES, WARN_ONLY

    code = {verdict: (gate.setting, verdict in WARN_ONLY) for verdict, gate in GATES.items()}
    rows = table(ROOT / "docs" / "breaker.md", "verdict", "when", "gate (`checks.`)")
    doc = {names(r["verdict"])[0]: (names(r["gate (`checks.`)"])[0], "warns" in r["gate (`checks.`)"]) for r in rows}
    assert doc == code


@functools.cache
def environment_variables() -> frozenset[str]:
    """The variables the code reads: every `EAGLE_DATA_*` string in its source, the engine kinds' key
    variables and the target profiles' tokenizer variables."""
    found = set()
    for path in Path(catalog.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found |= set(re.findall(r"^EAGLE_DATA_[A-Z0-9_]+$", node.value))
    found |= {kind.key_env for kind in builtin_kinds().values() if kind.key_env}
    found |= {p.tokenizer_env for p in read_profiles().values() if p.tokenizer_env}
    return frozenset(found)


def test_readme_settings_table_lists_every_environment_variable_the_code_reads():
    doc = {name for row in table(README, "variable", "meaning") for name in names(row["variable"])}
    code = environment_variables()
    assert code - doc == set(), "read by the code, missing from README's settings table"
    assert doc - code - THIRD_PARTY_ENV == set(), "in README's settings table, read nowhere in the code"


def test_readme_tokenizer_variable_names_the_profiles_that_read_it():
    row = re.search(r"^\| `EAGLE_DATA_TARGET_TOKENIZER` \|([^|]*)\|", README.read_text(), re.M)
    assert row, "README's settings table lost EAGLE_DATA_TARGET_TOKENIZER"
    code = {name for name, p in read_profiles().items() if p.tokenizer_env == "EAGLE_DATA_TARGET_TOKENIZER"}
    assert set(names(row[1])) == code


def test_every_variable_and_catalog_table_the_docs_name_exists():
    """Prose too: an `EAGLE_DATA_*` variable or a `[defaults.*]` / `[drafter.*]` table named anywhere in
    README or docs/ is one the code reads (or docker-compose sets) or the packaged catalog holds."""
    compose = set(re.findall(r"EAGLE_DATA_[A-Z0-9_]+", (ROOT / "docker" / "docker-compose.yaml").read_text()))
    packaged = tomllib.loads((Path(catalog.__file__).parent / "catalog.toml").read_text())
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        unknown = set(re.findall(r"EAGLE_DATA_[A-Z0-9_]+", text)) - environment_variables() - compose
        assert not unknown, f"{path.name} names variables the code never reads: {sorted(unknown)}"
        for section in re.findall(r"\[((?:defaults|drafter)(?:\.[a-z_]+)*)\]", text):
            node: Any = packaged
            for part in section.split("."):
                assert isinstance(node, dict) and part in node, f"{path.name} names [{section}]; catalog.toml has none"
                node = node[part]


def default(value: str) -> Any:
    """A Default cell as a value: `true`, `0.5`, `100,000`, `"all"`; None for anything else."""
    text = value.split()[0].strip("`") if value.strip() else ""
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text.replace(",", "").replace("_", ""))
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text.strip('"') if text.startswith('"') else None


@pytest.mark.parametrize(
    ("path", "section", "model", "nested"),
    [
        (DESIGN, "[datasets.<name>]", catalog.DatasetSpec, ("generation", "checks", "breaker", "on_policy")),
        (DESIGN, "[defaults.generation]", catalog.Generation, ()),
        (DESIGN, "[defaults.checks]", catalog.Checks, ()),
        (DESIGN, "[defaults.on_policy]", catalog.OnPolicy, ()),
        (ROOT / "docs" / "breaker.md", "[defaults.breaker]", catalog.Breaker, ()),
        (DESIGN, "[drafter]", drafter.DrafterSettings, ("decontamination", "hidden_states", "capture")),
        (DESIGN, "[drafter.decontamination]", evalsets.Decontamination, ()),
        (DESIGN, "[drafter.hidden_states]", drafter.HiddenStateRecipe, ()),
        (DESIGN, "[drafter.capture]", drafter.CaptureSettings, ()),
        (DESIGN, "[automation]", AutomationSettings, ()),
    ],
    ids=lambda value: value.strip("[]") if isinstance(value, str) else None,
)
def test_catalog_tables_list_every_key_with_its_default(path: Path, section: str, model: Any, nested: tuple):
    """Keys both ways; a default the doc states is the packaged catalog's (the table, or `[defaults]` for a
    dataset key), else the model's."""
    packaged: Any = tomllib.loads((Path(catalog.__file__).parent / "catalog.toml").read_text())
    for part in ["defaults"] if section == "[datasets.<name>]" else section.strip("[]").split("."):
        packaged = packaged.get(part, {})
    if path.name == "breaker.md":
        rows = table(path, "setting", "default")
    else:
        rows = [r for r in table(path, "key", "table", "default") if r["table"].strip("`") == section]
    doc = {names(r.get("setting") or r["key"])[0]: default(r["default"]) for r in rows}
    assert set(doc) == fields(model, *nested), f"{path.name} {section}: keys differ from {model.__name__}"
    for name, value in doc.items():
        if value is not None:
            expected = packaged.get(name, model.model_fields[name].default)
            assert value == expected, f"{path.name}: {name}'s default is {expected!r}, not {value!r}"


def test_hidden_states_doc_lists_the_checks_of_hidden_states(graph: Any):
    code = {key.name for key in graph.asset_check_keys if key.asset_key.to_user_string() == "hidden_states"}
    doc = {names(row["check"])[0] for row in table(ROOT / "docs" / "hidden-states.md", "check", "passes when")}
    assert doc == code


def contract_names(kind: str) -> set[str]:
    """The column names a contract lists (lower-case identifiers; `GENERATION_SCHEMA` is not a column)."""
    return {name for name in names(contract(kind)) if re.fullmatch(r"[a-z_][a-z0-9_]*", name)}


def test_prompts_contract_is_the_prompts_schema():
    assert contract_names("prompts") == set(PROMPTS_SCHEMA)


def test_generations_contract_is_the_generation_schema():
    assert contract_names("generations") == set(GENERATION_SCHEMA)


def test_validated_contract_lists_every_column_validation_adds():

    spec = catalog.catalog()[next(iter(catalog.catalog()))].model_copy(update={"target": "demo"})
    row: dict[str, Any] = dict.fromkeys(GENERATION_SCHEMA) | {
        "prompt_id": "p", "dataset": spec.name, "status": "ok", "finish_reason": "stop", "content": "Hi.",
        "reasoning": "", "completion_tokens": 3, "messages": [
            {"role": "user", "content": "Hello", "reasoning": None, "output_ids": None},
            {"role": "assistant", "content": "Hi.", "reasoning": "", "output_ids": None},
        ],
    }  # fmt: skip
    columns = set(validated_rows(spec, pl.DataFrame([row], schema=GENERATION_SCHEMA), "00000").columns)
    own = columns - set(GENERATION_SCHEMA) | {"prompt_id"}
    doc = contract_names("validated")
    assert own - doc == set(), "validation adds these columns; the validated contract omits them"
    assert doc - columns == set(), "the validated contract lists columns validation does not write"
