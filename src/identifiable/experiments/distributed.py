"""Running the stage pipeline on `torch.distributed`: every rank computes shards, rank 0 reduces.

Launch with `torchrun --nproc_per_node N -m identifiable reproduce …` (or `accelerate
launch`, which starts torchrun); from Python, call `reproduce` on every rank of an
initialised process group. What happens:

1. Rendezvous. Under torchrun the process group is created here from the environment
   (`WORLD_SIZE`, `RANK`, `MASTER_ADDR`, …) with gloo on CPU and NCCL on CUDA; a group the
   caller already initialised is used as it is. A single process needs no group.
2. Fingerprints. Every rank publishes a fingerprint of the package's code and of the run's
   settings in the process group's key-value store; a mismatch stops every rank with one line.
3. Work queue. All shards of all stages form one list, the most expensive first. A rank
   claims the next index with an atomic counter in the store (`store.add`), computes it
   unless the shared cache already holds it, and writes it to the cache. Which rank
   computes which shard therefore varies from run to run, but a shard's tables depend only
   on the settings, so this cannot change any output.
4. Reduce. Once every rank has finished (a barrier built on the same store, which notices a
   rank that failed), rank 0 loads every shard from the cache, in shard order, and reduces
   and renders exactly as a single process does.

Identity with a one-process run: a shard is computed by the same code on the same items
whichever rank runs it, tables round-trip through Parquet exactly (float64 included), and the
reduce runs once, in shard order. So outputs are byte-identical to a single-process run
with the same number of threads per process (thread count changes float summation order
inside BLAS, which is the one thing that can change the last bits).

Failure: a rank that raises publishes its one-line message; the others stop at the next
barrier with "rank R failed: …; rerun with --resume". A rank killed outright cannot publish;
torchrun then stops the others (SIGTERM, answered with one line), and the store-based
barrier times out with one line otherwise. Finished shards stay in the cache, so
`--resume` (with any number of ranks) computes only what is missing.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from identifiable.errors import IdentifiableError

DEFAULT_TIMEOUT_S = 1800.0
TIMEOUT_ENV = "IDENTIFIABLE_DIST_TIMEOUT"  # seconds; for the rendezvous and every wait
_POLL_S = 0.05


@dataclass(frozen=True)
class World:
    """The processes of one run. `store` is the c10d key-value store (None for one process);
    `prefix` namespaces this run's keys in it (a fresh one per `reproduce` call)."""

    rank: int = 0
    size: int = 1
    store: Any = None
    prefix: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def key(self, name: str) -> str:
        return f"identifiable/{self.prefix}/{name}"


SINGLE = World()


def _launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def local_device(device: str) -> str:
    """The device of this rank: under torchrun, "cuda" means this rank's own GPU (LOCAL_RANK)."""
    if device == "cuda" and _launched_by_torchrun():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def default_timeout() -> float:
    """Seconds a rank waits for the others (rendezvous included): $IDENTIFIABLE_DIST_TIMEOUT,
    else 30 minutes (probe fitting on rank 0 can keep the others waiting that long)."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise IdentifiableError(f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds")
    return value


def join(device: str = "cpu", *, timeout_s: float | None = None) -> World:
    """The world this process belongs to, creating the process group under torchrun.

    Without torchrun and without an initialised group this is one process (rank 0 of 1).
    """
    import torch.distributed as dist

    timeout_s = default_timeout() if timeout_s is None else timeout_s

    if not dist.is_available():
        return SINGLE
    if not dist.is_initialized():
        if not _launched_by_torchrun():
            return SINGLE
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            import torch

            if not torch.cuda.is_available():
                raise IdentifiableError(
                    "--device cuda was requested but this machine has no usable CUDA GPU; "
                    "use --device cpu (gloo) instead"
                )
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        try:
            with _native_stderr_held():
                dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        except Exception as err:  # c10d raises RuntimeError, DistStoreError, TimeoutError, ...
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise IdentifiableError(
                f"cannot join the process group at {where} ({first}); check that every node "
                "can reach MASTER_ADDR:MASTER_PORT and that --nnodes/--nproc_per_node match"
            ) from None
    size = dist.get_world_size()
    if size == 1:
        return SINGLE
    store = dist.distributed_c10d._get_default_store()
    # A fresh namespace per call, chosen by rank 0, so that two runs in one process group
    # (the Python API called twice) never share counters.
    box = [uuid.uuid4().hex if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return World(dist.get_rank(), size, store, str(box[0]), timeout_s)


@contextmanager
def _native_stderr_held() -> Iterator[None]:
    """Hold what native code writes to file descriptor 2 during the rendezvous.

    c10d logs a failed connection with a C++ stack trace straight to fd 2; the user should
    see one line saying what to do instead. On success the held text is replayed.
    """
    import tempfile

    sys.stderr.flush()
    with tempfile.TemporaryFile() as held:
        saved = os.dup(2)
        ok = False
        try:
            os.dup2(held.fileno(), 2)
            yield
            ok = True
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if ok:
                held.seek(0)
                data = held.read()
                if data:
                    os.write(2, data)


# ---- fingerprints --------------------------------------------------------------------


def code_fingerprint() -> str:
    """sha256 of the package's Python sources (every rank must run the same code)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def check_same_run(world: World, settings_key: str) -> None:
    """Raise on every rank unless all ranks run the same code with the same settings."""
    if not world.distributed:
        return
    mine = f"{code_fingerprint()}:{settings_key}"
    world.store.set(world.key(f"fingerprint/{world.rank}"), mine)
    keys = [world.key(f"fingerprint/{r}") for r in range(world.size)]
    _wait(world, lambda: world.store.check(keys), "compare fingerprints")
    for r in range(world.size):
        theirs = world.store.get(keys[r]).decode()
        if theirs != mine:
            what = "code" if theirs.split(":")[0] != mine.split(":")[0] else "settings"
            raise IdentifiableError(
                f"rank {r} runs different {what} than rank {world.rank} "
                f"(fingerprint {theirs} vs {mine}): install the same identifiable version on "
                "every node and pass the same arguments to every rank"
            )


# ---- failure-aware waiting ------------------------------------------------------------


def report_failure(world: World, message: str) -> None:
    """Publish this rank's failure so the others stop at their next wait."""
    if world.distributed:
        # the store may be gone with rank 0; then there is nobody left to tell
        with contextlib.suppress(Exception):
            world.store.set(world.key("failed"), f"rank {world.rank}: {message}")


# The work of a run starts once every rank has passed this barrier (rank 0 has locked and
# prepared the output folder): a failure before it is an up-front refusal, with nothing to
# resume, so no message then advises --resume.
WORK_STARTS = "out-ready"
_started: set[str] = set()  # the prefixes of the runs in this process whose work started


def work_started(world: World) -> bool:
    return world.prefix in _started


def _rerun(world: World) -> str:
    return "rerun with --resume" if work_started(world) else "rerun the same command"


def _wait(world: World, done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + world.timeout_s
    failed = world.key("failed")
    while not done():
        if world.store.check([failed]):
            why = world.store.get(failed).decode()
            raise IdentifiableError(f"stopped: {why}; fix it and {_rerun(world)}")
        if time.monotonic() > deadline:
            raise IdentifiableError(
                f"stopped: timed out after {world.timeout_s:.0f} s waiting for the other ranks "
                f"to {what} (a rank may have died); {_rerun(world)}"
            )
        time.sleep(_POLL_S)


def barrier(world: World, name: str) -> None:
    """Wait until every rank reaches the barrier `name`; stop if any rank failed."""
    if not world.distributed:
        return
    key = world.key(f"barrier/{name}")
    world.store.add(key, 1)
    _wait(world, lambda: world.store.add(key, 0) >= world.size, f"reach '{name}'")
    if name == WORK_STARTS:
        _started.add(world.prefix)


def is_main_process() -> bool:
    """Whether this process is rank 0 (or alone): the one that prints a run's summary."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0") or 0) == 0


def broadcast(world: World, name: str, value: str | None) -> str:
    """Rank 0's `value` on every rank (through the store, so failures are noticed)."""
    if not world.distributed:
        assert value is not None
        return value
    key = world.key(f"value/{name}")
    if world.is_main:
        assert value is not None
        world.store.set(key, value)
    _wait(world, lambda: world.store.check([key]), f"share '{name}'")
    return world.store.get(key).decode()


@contextmanager
def stop_cleanly(world: World) -> Iterator[None]:
    """Under torchrun, a SIGTERM (the launcher stopping us because another rank died) ends
    this rank with one line instead of a traceback; an error on this rank is published."""
    previous = None
    if world.distributed:

        def on_term(signum: int, frame: Any) -> None:
            advice = (
                "rerun with --resume to finish the missing shards"
                if work_started(world)
                else "its error says what to fix"
            )
            print(
                f"error: rank {world.rank} stopped by the launcher (another rank failed); {advice}",
                file=sys.stderr,
            )
            os._exit(143)

        try:
            previous = signal.signal(signal.SIGTERM, on_term)
        except ValueError:  # not the main thread: leave signals alone
            previous = None
    try:
        yield
    except IdentifiableError as err:
        report_failure(world, str(err))
        raise
    except KeyboardInterrupt:
        report_failure(world, "interrupted")
        raise
    except Exception as err:
        report_failure(world, f"{type(err).__name__}: {err}")
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


# ---- the work queue --------------------------------------------------------------------


def work_order(costs: Sequence[float]) -> list[int]:
    """Indices of the global shard list, most expensive first (ties keep list order), so the
    long shards start early and the short ones fill the gaps at the end."""
    return sorted(range(len(costs)), key=lambda i: (-costs[i], i))


def claims(world: World, order: Sequence[int]) -> Iterator[int]:
    """The shard indices this rank should compute, claimed one at a time from the store."""
    if not world.distributed:
        yield from order
        return
    counter = world.key("next")
    while True:
        slot = world.store.add(counter, 1) - 1
        if slot >= len(order):
            return
        if world.store.check([world.key("failed")]):
            _wait(world, lambda: False, "continue")  # raises with the failed rank's message
        yield order[slot]
