"""Every export target loaded by its trainer's own released code from a demo capture (the Makefile's peer
block installs speculators 0.9.0, specforge 0.2.0 and nvidia-modelopt 0.47.0; docs/facts.md says how and
why), with one forward/loss step where the trainer runs on CPU (speculators' EAGLE-3 and DFlash,
SpecForge's DFlash family; SpecForge's EAGLE-3 loss needs Triton). One capture per group of
targets that share layers and norm, shared by the whole module."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

from eagle_data import layout
from eagle_data.catalog import CatalogError, load_catalog
from eagle_data.drafter.settings import CaptureSettings, load_drafter_settings
from eagle_data.stages.draft_vocab import write_draft_vocab
from eagle_data.stages.hidden_states import write_hidden_states
from eagle_data.storage import ShardStore

GROUPS = {  # one capture each: the targets in a group share their layers and last state
    "eagle3_after": ("specforge-eagle3", "modelopt", "native"),
    "eagle3_before": ("speculators-eagle3",),
    "dflash_after": ("specforge-dflash", "specforge-domino", "specforge-dspark"),
    "dflash_before": ("speculators-dflash",),
}
ROWS, SHARD_ROWS, HIDDEN, DRAFT_VOCAB, AUX = 12, 6, 64, 64, 3
SPARSE, UNSUPERVISED = 3, 7  # rows no two adjacent supervised tokens / no supervised token at all


def mix_frame(dataset: str) -> pl.DataFrame:
    """12 rows of real-vocabulary ids: a prompt (mask 0) then a reply (mask 1); row 3 supervises every other
    token only (SpecForge's DFlash family refuses it), row 7 nothing (speculators' prepare step drops it)."""
    rng = random.Random(29)
    ids, masks = [], []
    for row in range(ROWS):
        prompt, reply = rng.randint(2, 8), rng.randint(4, 30)
        ids.append([rng.randrange(5, 150_000) for _ in range(prompt + reply)])
        mask = [0] * prompt + [1] * reply
        if row == SPARSE:
            mask = [i % 2 for i in range(len(mask))]
        if row == UNSUPERVISED:
            mask = [0] * len(mask)
        masks.append(mask)
    return pl.DataFrame(
        {"prompt_id": [f"p{i}" for i in range(ROWS)], "dataset": dataset, "input_ids": ids, "loss_mask": masks},
        schema_overrides={"input_ids": pl.List(pl.Int32), "loss_mask": pl.List(pl.UInt8)},
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> dict[str, Any]:
    """The mix, one capture per group (fp32 on CPU, two shards of 6 rows) and the draft vocabulary files."""
    specs = [s.model_copy(update={"target": "demo"}) for s in load_catalog(profile="demo").values()]
    root = tmp_path_factory.mktemp("trainers")
    store = ShardStore(str(root))
    frame = mix_frame(specs[0].name)
    store.write_frame(layout.mix(), frame)
    captures = {}
    for group, names in GROUPS.items():
        settings = CaptureSettings(
            formats=names, shard_rows=SHARD_ROWS, dtype="fp32", recapture_rows=1, dflash_layers=AUX
        )  # 3 DFlash layers: the demo model has 2, and speculators wants its layer ids distinct
        figures, shards = write_hidden_states(specs, store, ["00000", "00001"], settings, str(demo_model), "cpu")
        failed = {p: n for p, s in shards.items() for n in ("ids_match_mix", "finite") if not s.found.passed(n)}
        assert not failed and all(s.found.data_ok() for s in shards.values()), failed
        captures[group] = {"path": Path(figures["path"]), "figures": figures, "shards": shards}
    vocab = write_draft_vocab(specs, store, (DRAFT_VOCAB,), print, ("speculators-eagle3", "modelopt"))
    return {"root": root, "frame": frame, "captures": captures, "vocab": vocab, "model": demo_model}


@pytest.fixture(scope="module")
def target(demo_model: Path) -> Any:
    """The demo checkpoint with its LM head: the verifier's embeddings, final norm and head."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(demo_model, dtype=torch.float32)


def _mix_rows(demo: dict[str, Any]) -> dict[int, tuple[list[int], list[int]]]:
    return dict(enumerate(demo["frame"].select("input_ids", "loss_mask").iter_rows()))


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "domino", "dspark"])
def test_specforge_reads_each_kind_through_its_own_registry(demo: dict[str, Any], kind: str) -> None:
    from specforge.algorithms.builtin import builtin_algorithm_registry
    from specforge.runtime.data_plane.feature_store import load_feature_file

    group = "eagle3_after" if kind == "eagle3" else "dflash_after"
    registration = builtin_algorithm_registry().resolve(kind)
    provider = registration.providers.offline_for("text")
    folder = demo["captures"][group]["path"] / f"specforge-{kind}"
    refs = provider.build_reader(str(folder), run_id="t", ttt_length=1, max_len=2048).read()
    normalize, collate = provider.build_normalizer(max_len=2048), provider.build_collator()
    mix, loaded = _mix_rows(demo), []
    for ref in refs:
        path = ref.feature_store_uri.removeprefix("file://")
        raw = load_feature_file(path)
        assert set(raw) == set(provider.capture_layout.output_names)  # the keys SpecForge's own capture writes
        row = int(Path(path).stem.removeprefix("data_"))
        assert raw["input_ids"].tolist() == mix[row][0] and raw["loss_mask"].tolist() == mix[row][1]
        loaded.append(normalize(raw))
    batch = collate(loaded[:4])
    assert len(loaded) == ROWS - 2 * (kind != "eagle3")  # the DFlash family: rows 3 and 7 set aside (its floor)
    width = AUX * HIDDEN
    feature = "hidden_state" if kind == "eagle3" else "hidden_states"
    assert batch[feature].shape[0] == 4 and batch[feature].shape[-1] == width
    if kind == "dspark":
        assert batch["target_last_hidden_states"].shape[-1] == HIDDEN
    eligible = registration.providers.model.loss_mask_filter
    if eligible is not None:  # SpecForge's own floor accepts every row we kept and refuses those we set aside
        assert all(eligible(m["loss_mask"][0]) for m in loaded)
        assert not any(eligible(torch.tensor(mix[row][1])) for row in (SPARSE, UNSUPERVISED))


@pytest.mark.parametrize("kind", ["dflash", "domino", "dspark"])
def test_specforge_dflash_family_trains_a_step_on_cpu(demo: dict[str, Any], target: Any, kind: str) -> None:
    """SpecForge's own draft model and training wrapper of each kind, on a batch its own loader made from our
    files (one draft layer; the target's embeddings and LM head from the demo checkpoint)."""
    from specforge.algorithms.builtin import builtin_algorithm_registry
    from specforge.algorithms.common import dflash_family_model as online
    from specforge.modeling.draft.dflash import DFlashDraftModel
    from specforge.modeling.draft.domino import DominoDraftModel
    from specforge.modeling.draft.dspark import DSparkDraftModel
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from transformers import AutoConfig

    draft_class, wrapper = {
        "dflash": (DFlashDraftModel, online.OnlineDFlashModel),
        "domino": (DominoDraftModel, online.OnlineDominoModel),
        "dspark": (DSparkDraftModel, online.OnlineDSparkModel),
    }[kind]
    config = AutoConfig.from_pretrained(demo["model"])
    config.num_hidden_layers, config.num_target_layers, config.block_size = 1, 2, 4
    config.layer_types, config._attn_implementation = ["full_attention"], "sdpa"
    config.dflash_config = {"target_layer_ids": list(range(AUX))}
    if kind == "domino":
        config.dflash_config.update(emb_dim=16, gru_hidden_dim=16)
    model = wrapper(
        draft_class(config), target.lm_head, target.model.embed_tokens, mask_token_id=config.vocab_size - 1,
        block_size=4, attention_backend="sdpa", num_anchors=8,
    )  # fmt: skip
    provider = builtin_algorithm_registry().resolve(kind).providers.offline_for("text")
    folder = demo["captures"]["dflash_after"]["path"] / f"specforge-{kind}"
    refs = provider.build_reader(str(folder), run_id="t", ttt_length=1, max_len=2048).read()
    normalize = provider.build_normalizer(max_len=2048)
    batch = provider.build_collator()([normalize(load_feature_file(r.feature_store_uri[7:])) for r in refs[:3]])
    names = ("input_ids", "hidden_states", "loss_mask", "target_last_hidden_states")[: 4 if kind == "dspark" else 3]
    loss = model(**{name: batch[name] for name in names})[0]
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_speculators_arrow_dataset_loads_every_shard_with_the_verifier_state(
    demo: dict[str, Any], target: Any, kind: str
) -> None:
    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.recovery import SampleUnavailable

    norm = target.model.norm  # the verifier's final norm
    after = demo["captures"]["eagle3_after"]["path"] / "specforge-eagle3"
    mix, aux, total = _mix_rows(demo), AUX, 0
    for shard in ("00000", "00001"):
        datapath = demo["captures"][f"{kind}_before"]["path"] / f"speculators-{kind}" / shard
        data = ArrowDataset(max_len=2048, datapath=datapath, on_missing="raise", hidden_states_dtype=torch.float32)
        items = [data[i] for i in range(len(data))]
        assert not any(isinstance(item, SampleUnavailable) for item in items)
        for item, row in zip(items, data.data.with_format(None)["row"], strict=True):
            assert item["input_ids"].tolist() == mix[row][0] and item["loss_mask"].tolist() == mix[row][1]
            assert item["hidden_states"].shape == (len(mix[row][0]), aux * HIDDEN)
            # speculators norms the verifier state itself: normed, it is SpecForge's after-norm last state
            specforge = torch.load(after / "rows_0-2000" / f"data_{row}.ckpt", weights_only=True)["hidden_state"][0]
            assert torch.allclose(norm(item["verifier_last_hidden_states"]), specforge, atol=1e-5)
        batch = CollateFn(256, HIDDEN, aux, torch.float32)(items[:3])
        assert batch["hidden_states"].shape == (1, 256, aux * HIDDEN)
        total += len(items)
    assert total == ROWS - 1  # the unsupervised row set aside, as speculators' prepare step drops it


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_speculators_trains_a_step_on_cpu(demo: dict[str, Any], kind: str) -> None:
    from speculators.models.dflash.core import DFlashDraftModel
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.train.data import ArrowDataset, CollateFn
    from transformers import AutoConfig

    folder = Path(demo["vocab"]["mapping_64_path"]).parent
    d2t, t2d = (torch.from_numpy(np.load(folder / f"{name}-{DRAFT_VOCAB}.npy")) for name in ("d2t", "t2d"))
    config = AutoConfig.from_pretrained(demo["model"])
    config.num_hidden_layers = 1  # one draft layer
    args = {
        "verifier_name_or_path": str(demo["model"]), "draft_vocab_size": DRAFT_VOCAB, "norm_before_residual": False,
        "ttt_steps": 2, "ttt_step_loss_decay": 1.0, "target_layer_ids": [0, 1, 2], "draft_attn_impl": "sdpa",
        "block_size": 4, "loss_fn": "kl_div" if kind == "eagle3" else "ce", "loss_implementation": "eager",
        "mask_token_id": config.vocab_size - 1,  # DFlash's mask token: any id the verifier knows
    }  # fmt: skip
    model_class = Eagle3DraftModel if kind == "eagle3" else DFlashDraftModel
    model = model_class.from_training_args(config, t2d=t2d, d2t=d2t, **args)
    step_kwargs, _ = model_class.get_trainer_kwargs(**args)
    datapath = demo["captures"][f"{kind}_before"]["path"] / f"speculators-{kind}" / "00000"
    data = ArrowDataset(max_len=2048, datapath=datapath, on_missing="raise", hidden_states_dtype=torch.float32)
    batch = CollateFn(128, HIDDEN, 3, torch.float32)([data[i] for i in range(len(data))])
    _, loss, _ = model(**{k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}, **step_kwargs)
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()


def test_speculators_vocab_files_equal_its_own_mapping(demo: dict[str, Any]) -> None:
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    folder = Path(demo["vocab"]["mapping_64_path"]).parent
    freq = torch.load(folder / layout.TOKEN_FREQ_FILE, weights_only=True)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, DRAFT_VOCAB, demo["vocab"]["target_vocab_size"])
    assert np.array_equal(np.load(folder / f"d2t-{DRAFT_VOCAB}.npy"), d2t.numpy())
    assert np.array_equal(np.load(folder / f"t2d-{DRAFT_VOCAB}.npy"), t2d.numpy())
    assert torch.equal(torch.load(folder / f"d2t-{DRAFT_VOCAB}.pt", weights_only=True), d2t)  # ModelOpt's cache


def test_modelopt_offline_dataset_finds_and_collates_every_row(demo: dict[str, Any]) -> None:
    from modelopt.torch.speculative.eagle.utils import EagleOfflineDataCollator, OfflineSupervisedDataset

    folder = demo["captures"]["eagle3_after"]["path"] / "modelopt"
    files = sorted(folder.rglob("*.pt"))  # how ModelOpt's main.py finds the dump
    data = OfflineSupervisedDataset([str(f) for f in files], answer_only_loss=True)
    mix = _mix_rows(demo)
    items = [data[i] for i in range(len(data))]
    assert len(items) == ROWS
    for item, path in zip(items, files, strict=True):
        ids, mask = mix[int(path.stem)]
        assert item["input_ids"].tolist() == ids and item["loss_mask"].tolist() == mask
        assert item["base_model_hidden_states"].shape == (len(ids), HIDDEN)
        assert item["aux_hidden_states"].shape == (len(ids), 3 * HIDDEN)
    batch = EagleOfflineDataCollator(train_len=64)(items)
    assert batch["base_model_outputs"]["aux_hidden_states"].shape == (ROWS, 64, 3 * HIDDEN)


@pytest.mark.parametrize(
    ("formats", "setting", "named"),
    [
        ('["speculators-eagle3"]', 'last_state = "after_norm"', 'last_state = "after_norm"'),
        ('["specforge-dspark"]', 'last_state = "none"', 'last_state = "none"'),
        ('["specforge-dflash"]', 'layers = "eagle3"', 'layers = "eagle3"'),
        ('["specforge-eagle3", "speculators-eagle3"]', "", "formats"),
    ],
)
def test_a_setting_a_chosen_trainer_cannot_use_is_refused_in_one_line(
    tmp_path: Path, formats: str, setting: str, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(f"[drafter.capture]\nformats = {formats}\n{setting}\n")
    monkeypatch.setenv("EAGLE_DATA_CATALOG", str(catalog))
    with pytest.raises(CatalogError) as caught:
        load_drafter_settings()  # the asset loads the settings before it loads the model
    message = str(caught.value)
    assert "\n" not in message and f"[drafter.capture] {named}" in message and str(catalog) in message


def test_the_docs_table_is_the_registry() -> None:
    from eagle_data.drafter.trainers import markdown_table

    docs = Path(__file__).parents[2] / "docs" / "hidden-states.md"
    assert markdown_table() in docs.read_text(), "paste trainers.markdown_table() into docs/hidden-states.md"
