"""Start N SGLang servers as subprocesses (one per GPU, or tp x dp GPUs each) and tear them down.

Optional: production attaches to servers that are already running (SGLangSettings.urls). The config
mirrors SGLang's server arguments, so a tuned launch is configuration, not shell history. Each server
runs in its own process group with its own log file; a server that exits or never becomes healthy
raises LaunchError with the last lines of its log.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eagle_data import settings
from eagle_data.secrets import mask_url
from eagle_data.types import UserError

LOG_TAIL_LINES = 20


class LaunchError(UserError, RuntimeError):
    """A server could not be started; the message ends with the tail of its log."""


class LaunchConfig(BaseModel):
    """SGLang server arguments for a fleet of identical servers (None: SGLang's default).

    Attributes:
        num_servers: data-parallel servers to start; each gets `tp * dp` GPUs and its own port.
        gpu_ids: the GPUs to hand out, in order (default 0 .. num_servers * tp * dp - 1).
        command: the program to run; default `<python> -m sglang.launch_server`. Tests put a stand-in here.
        extra_args: appended verbatim (any SGLang flag not modelled here).
        health_timeout_s: how long a server may take to answer /health 200 (model loading, CUDA graphs).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_path: str = Field(min_length=1)
    num_servers: int = Field(1, gt=0)
    tp: int = Field(1, gt=0)
    dp: int = Field(1, gt=0)
    gpu_ids: tuple[int, ...] | None = None
    host: str = "127.0.0.1"
    base_port: int = Field(30000, gt=0, lt=65536)
    mem_fraction_static: float | None = Field(None, gt=0, lt=1)
    max_running_requests: int | None = Field(None, gt=0)
    max_mamba_cache_size: int | None = Field(None, gt=0)
    context_length: int | None = Field(None, gt=0)
    chunked_prefill_size: int | None = None  # -1 disables chunked prefill
    schedule_policy: str | None = None  # lpm | random | fcfs | dfs-weight | lof | priority
    cuda_graph_max_bs: int | None = Field(None, gt=0)
    reasoning_parser: str | None = None  # e.g. qwen3, deepseek-r1, kimi
    extra_args: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    log_dir: str | None = None
    health_timeout_s: float = Field(1800.0, gt=0)

    @model_validator(mode="after")
    def _fits(self) -> LaunchConfig:
        if self.gpu_ids is not None and len(self.gpu_ids) != self.num_servers * self.gpus_per_server:
            raise ValueError(
                f"gpu_ids has {len(self.gpu_ids)} GPUs, but {self.num_servers} servers x tp {self.tp} "
                f"x dp {self.dp} need {self.num_servers * self.gpus_per_server}"
            )
        if self.base_port + self.num_servers > 65536:
            raise ValueError(f"ports {self.base_port}..{self.base_port + self.num_servers - 1} do not fit")
        return self

    @property
    def gpus_per_server(self) -> int:
        return self.tp * self.dp

    def urls(self) -> list[str]:
        return [f"http://{self.host}:{self.base_port + i}" for i in range(self.num_servers)]

    def gpus(self, index: int) -> list[int]:
        ids = self.gpu_ids or tuple(range(self.num_servers * self.gpus_per_server))
        return list(ids[index * self.gpus_per_server : (index + 1) * self.gpus_per_server])

    def argv(self, index: int) -> list[str]:
        """The command line of server `index`."""
        argv = list(self.command or (sys.executable, "-m", "sglang.launch_server"))
        argv += ["--model-path", self.model_path, "--host", self.host, "--port", str(self.base_port + index)]
        options = {
            "--tp-size": self.tp if self.tp > 1 else None,
            "--dp-size": self.dp if self.dp > 1 else None,
            "--mem-fraction-static": self.mem_fraction_static,
            "--max-running-requests": self.max_running_requests,
            "--max-mamba-cache-size": self.max_mamba_cache_size,
            "--context-length": self.context_length,
            "--chunked-prefill-size": self.chunked_prefill_size,
            "--schedule-policy": self.schedule_policy,
            "--cuda-graph-max-bs": self.cuda_graph_max_bs,
            "--reasoning-parser": self.reasoning_parser,
        }
        for flag, value in options.items():
            if value is not None:
                argv += [flag, str(value)]
        return argv + list(self.extra_args)


@dataclass
class LaunchedServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class Launcher:
    """Context manager: start the servers, wait until all are healthy, stop them (process groups) on exit."""

    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.servers: list[LaunchedServer] = []

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def __enter__(self) -> Launcher:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> list[str]:
        """Start every server and block until all answer /health; on failure stop them all and raise."""
        cfg = self.config
        log_dir = Path(cfg.log_dir or tempfile.mkdtemp(prefix="sglang-logs-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            for i, url in enumerate(cfg.urls()):
                log_path = log_dir / f"server-{cfg.base_port + i}.log"
                env = {**settings.environment(), **cfg.env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, cfg.gpus(i)))}
                with log_path.open("ab") as log:
                    process = subprocess.Popen(
                        cfg.argv(i), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env=env, start_new_session=True,
                    )
                self.servers.append(LaunchedServer(url, process, log_path))
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self.urls

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.health_timeout_s
        waiting = list(self.servers)
        while waiting:
            for server in list(waiting):
                code = server.process.poll()
                if code is not None:
                    raise LaunchError(
                        f"SGLang server {mask_url(server.url)} exited with code {code} before it was healthy; "
                        f"log {server.log_path}, last lines:\n{server.log_tail()}"
                    )
                if _healthy(server.url):
                    waiting.remove(server)
            if waiting and time.monotonic() > deadline:
                server = waiting[0]
                raise LaunchError(
                    f"SGLang server {mask_url(server.url)} did not become healthy within "
                    f"{self.config.health_timeout_s:g}s (raise health_timeout_s for large models); "
                    f"log {server.log_path}, last lines:\n{server.log_tail()}"
                )
            if waiting:
                time.sleep(0.2)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM each server's process group, then SIGKILL what is left after `grace_s`."""
        atexit.unregister(self.stop)
        for server in self.servers:
            _signal_group(server.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for server in self.servers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
            _signal_group(server.process, signal.SIGKILL)  # children left behind (schedulers, detokenizer)
            server.process.wait()
        self.servers = []


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)  # start_new_session: the group id is the server's pid


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
