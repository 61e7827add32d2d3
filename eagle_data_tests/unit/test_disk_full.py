"""A disk that fills while paying (#34): the run stops sending at once, retries its checkpoint for a bounded
time, and ends in one line; a resume pays for no answered turn again, or exactly those the line counts."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle_data.engines import make_engine
from eagle_data.runner import RunnerSettings, run_generation
from eagle_data.standins.openai_fake import FakeOpenAI, Faults, prompt_shards, spec_for_tests
from eagle_data.storage import ShardStore, StorageError, UnwritableRoot

PROMPTS, TURNS, FILL_AT = 60, 2, 15  # the disk fills once 15 turns were answered


class FillingDisk:
    """The fault: every fsync (how a full disk shows on appends and renames alike) fails with ENOSPC while
    the disk is full, from the FILL_AT-th answer until `free()`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, server: FakeOpenAI, only: str = "") -> None:
        """`only`: full for files whose name holds it (a big shard that does not fit where appends do)."""
        self.full, self.server, self.sent_at_fill = threading.Event(), server, 0
        real = os.fsync

        def fsync(fd: int) -> None:
            if self.full.is_set() and only in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        threading.Thread(target=self._fill, daemon=True).start()

    def _fill(self) -> None:
        while sum(self.server.answered.values()) < FILL_AT:
            time.sleep(0.005)
        self.sent_at_fill = self.server.received
        self.full.set()

    def free(self, after_s: float) -> None:
        threading.Timer(after_s, self.full.clear).start()


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    srv = FakeOpenAI(Faults(latency_s=0.05))
    srv.start()
    yield srv
    srv.stop()


def generate(server: FakeOpenAI, root: Path) -> dict:
    engine = make_engine("openai", base_url=f"http://127.0.0.1:{server.port}/v1", model="m", max_tokens=64)
    settings = RunnerSettings(max_in_flight=5, initial_in_flight=5, flush_every_s=0.1, lease_ttl_s=1.5,
                              progress_bar=False)  # fmt: skip
    shards = prompt_shards(1, PROMPTS, turns=TURNS)
    return run_generation(engine, spec_for_tests(), shards, ShardStore(str(root)), settings=settings, log=print)


def test_a_disk_freed_within_the_bound_loses_nothing_and_the_resume_pays_no_turn_twice(
    server: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FillingDisk(monkeypatch, server)
    disk.free(after_s=0.6)
    with pytest.raises(StorageError) as err:
        generate(server, tmp_path)
    message = str(err.value)
    assert f"b7_sharegpt: the output root {tmp_path} is full (no space left on device): stopped sending" in message
    assert "every answered turn reached the result log, so nothing already answered is paid again" in message
    assert "\n" not in message
    assert server.received - disk.sent_at_fill < 30, "the run went on sending after the disk filled"
    generate(server, tmp_path)
    assert sum(server.answered.values()) == PROMPTS * TURNS and max(server.answered.values()) == 1


@pytest.mark.timeout(30)  # the old code waited forever for a disk that stays full
def test_a_disk_that_stays_full_says_how_many_turns_will_be_asked_again(
    server: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FillingDisk(monkeypatch, server)
    with pytest.raises(StorageError, match=r"stopped sending at once; (\d+) answered turns could not be written "
                       "and will be asked again: free space") as err:  # fmt: skip
        generate(server, tmp_path)
    lost = int(str(err.value).split("at once; ")[1].split()[0])
    disk.full.clear()
    generate(server, tmp_path)
    twice = sum(1 for n in server.answered.values() if n > 1)
    assert lost > 0 and twice == lost and max(server.answered.values()) == 2


def test_a_shard_too_big_for_the_disk_leaves_its_turns_in_the_result_log_for_the_resume(
    server: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FillingDisk(monkeypatch, server, only=".parquet")
    with pytest.raises(StorageError, match="every answered turn reached the result log"):
        generate(server, tmp_path)
    monkeypatch.undo()
    generate(server, tmp_path)
    assert sum(server.answered.values()) == PROMPTS * TURNS and max(server.answered.values()) == 1


def test_an_append_the_full_disk_refused_is_cut_back_so_its_retry_writes_each_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes of a refused append stay in the file (its fsync failed after the write); the retry then
    repeated them, or joined a torn line to its first one."""
    store, key, real = ShardStore(str(tmp_path)), "ds/_log/turns.jsonl", os.fsync
    store.append_bytes(key, b"first\n")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(UnwritableRoot, match="is full \\(no space left on device\\)"):
        store.append_bytes(key, b"second\n")
    monkeypatch.setattr(os, "fsync", real)
    store.append_bytes(key, b"second\n")
    assert (tmp_path / key).read_bytes() == b"first\nsecond\n"
