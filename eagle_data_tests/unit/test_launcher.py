"""The SGLang launcher, with the stand-in server (or a failing command) in place of sglang."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from pydantic import ValidationError

from eagle_data.engines.launcher import LaunchConfig, Launcher, LaunchError
from eagle_data.standins.sglang_fake import free_port_block

REPO = Path(__file__).resolve().parents[2]
FAKE = (sys.executable, "-m", "eagle_data.standins.sglang_fake")


def stand_in(tmp_path: Path, **overrides: object) -> LaunchConfig:
    settings: dict[str, object] = {
        "model_path": "Qwen/Qwen3-8B", "num_servers": 2, "base_port": free_port_block(2), "command": FAKE,
        "env": {"PYTHONPATH": str(REPO)}, "log_dir": str(tmp_path), "health_timeout_s": 20,
    }
    return LaunchConfig(**{**settings, **overrides})


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return dict(json.load(resp))


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_production_launch_is_configuration() -> None:
    config = LaunchConfig(
        model_path="/models/Qwen3-Next-80B-A3B-Thinking", num_servers=7, mem_fraction_static=0.93,
        max_running_requests=64, max_mamba_cache_size=200, reasoning_parser="qwen3", context_length=32768,
        chunked_prefill_size=8192, schedule_policy="lpm", cuda_graph_max_bs=64,
        extra_args=("--enable-metrics",),
    )
    argv = config.argv(6)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--model-path"] == "/models/Qwen3-Next-80B-A3B-Thinking" and flags["--port"] == "30006"
    assert flags["--mem-fraction-static"] == "0.93" and flags["--max-running-requests"] == "64"
    assert flags["--max-mamba-cache-size"] == "200" and flags["--reasoning-parser"] == "qwen3"
    assert flags["--cuda-graph-max-bs"] == "64" and flags["--schedule-policy"] == "lpm"
    assert "--tp-size" not in flags and argv[-1] == "--enable-metrics"
    assert config.gpus(6) == [6] and len(config.urls()) == 7


def test_tp_servers_get_consecutive_gpus() -> None:
    config = LaunchConfig(model_path="m", num_servers=2, tp=2, gpu_ids=(4, 5, 6, 7))
    assert config.gpus(0) == [4, 5] and config.gpus(1) == [6, 7]
    assert config.argv(1)[config.argv(1).index("--tp-size") + 1] == "2"


@pytest.mark.parametrize(
    "bad",
    [
        {"gpu_ids": (0, 1, 2)},  # 2 servers x tp 2 need 4
        {"mem_fraction_static": 1.2},
        {"num_servers": 0},
        {"base_port": 65535},
        {"max_running_requests": 0},
        {"mem_fraction": 0.9},  # a typo is an error, not ignored
    ],
)
def test_bad_launch_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        LaunchConfig(**{"model_path": "m", "num_servers": 2, "tp": 2, **bad})


def test_launcher_starts_stand_ins_and_tears_them_down(tmp_path: Path) -> None:
    config = stand_in(tmp_path, gpu_ids=(3, 5))
    with Launcher(config) as launcher:
        groups = [s.process.pid for s in launcher.servers]
        infos = [get_json(url + "/server_info") for url in launcher.urls]
        assert all(group_alive(g) for g in groups)
    assert [i["cuda_visible_devices"] for i in infos] == ["3", "5"]
    assert [i["model_path"] for i in infos] == ["Qwen/Qwen3-8B"] * 2
    assert not any(group_alive(g) for g in groups)  # no process left
    assert launcher.servers == []


def test_a_server_that_never_becomes_healthy_is_a_clear_error_within_the_timeout(tmp_path: Path) -> None:
    config = stand_in(tmp_path, extra_args=("--unhealthy",), health_timeout_s=4)  # > its start on a busy box
    launcher = Launcher(config)
    start = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launcher.start()
    assert time.monotonic() - start < 4 + 20  # the health timeout bounds the wait, with room for a loaded box
    message = str(err.value)
    assert "did not become healthy within 4s" in message and config.urls()[0] in message
    assert "loading weights (never finishes)" in message  # the tail of its log
    assert launcher.servers == []


def test_a_server_that_exits_shows_its_last_log_lines(tmp_path: Path) -> None:
    script = "import sys\nfor i in range(30): print('line', i)\nprint('CUDA out of memory')\nsys.exit(3)"
    config = stand_in(tmp_path, command=(sys.executable, "-c", script), num_servers=1)
    with pytest.raises(LaunchError) as err:
        Launcher(config).start()
    message = str(err.value)
    assert "exited with code 3" in message and "CUDA out of memory" in message
    # only the last 20 lines, on one line (a user error is one line: docs/design.md)
    assert "line 11 line 12" in message and "line 10 " not in message and "\n" not in message
