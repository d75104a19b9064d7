"""`pack build --engine ray --tasks N [--ray-address ADDR]`: the tasks of a build
(tasks.py) as Ray tasks on an existing cluster, or on a local one started here.

    1. prepare_tasks (here, once): OUT checked, the tasks recorded
    2. N Ray tasks run_task(cfg, i) (tokenize), each asking Ray for --workers CPUs and running
       --workers tokenizer threads; a worker process that dies is retried by Ray and the retry
       resumes from the task's own checkpoint; an error of the build itself (bad input under
       --on-error fail, a full disk) is not retried: it stops the build with its own line
    3. each task places its own shards as soon as the tasks before it are done (overlapping
       the others' tokenizing); Ray tasks place_task(out, i) for the rest, in parallel
    4. merge (here): the dataset appears under OUT
One progress bar here sums what the tasks report: each tokenize task is a Ray streaming
generator that yields its progress as it goes (no actor: one Python process fewer per build).
Every node must see OUT and the inputs at the same paths and have longpack installed (the
workers import it).
"""

import dataclasses
import logging
import queue
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from longpack.core import LongpackError, SettingsError, install_hint
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.progress import Progress
from longpack.pipeline.store.destination import Destination

MAX_RETRIES = 3  # a task's worker process may die this many times before the build stops
POLL_SECONDS = 0.5


def run(cfg: BuildConfig, how, dest: Destination, show_progress: bool | None):
    """--engine ray (launch.py): every task on the cluster at --ray-address, then the merge."""
    from longpack.pipeline.distribute.launch import Outcome

    return Outcome(build_with_ray(cfg, how.ray_address, show_progress, dest))


def build_with_ray(cfg: BuildConfig, address: str | None, show_progress: bool | None,
                   dest: Destination | None = None) -> dict:
    from longpack.pipeline.distribute import tasks

    dest = dest or Destination.of(cfg)
    ray = _import_ray()
    started_here = not ray.is_initialized()
    with ThreadPoolExecutor(1) as pool:  # checking OUT (the tokenizer's load) while connecting
        prepared = pool.submit(tasks.prepare_tasks, cfg, dest=dest)
        if started_here:
            _connect(ray, address)
        try:
            finished = prepared.result()
        except BaseException:
            if started_here:
                ray.shutdown()
            raise
    if finished is not None:
        if started_here:
            ray.shutdown()
        return finished
    try:
        _check_cpus(ray, cfg.workers)
        run = ray.remote(num_cpus=cfg.workers, max_retries=MAX_RETRIES, retry_exceptions=False,
                         num_returns="streaming")(_tokenize)
        _wait(ray, {run.remote(cfg, i, dest): i for i in range(cfg.tasks)},
              Progress(_input_bytes(cfg), None, show_progress))
        place = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(_place)
        work = str(dest.local)  # --out, or the staging folder of an --out URL
        placed = set(tasks.task_status(work)["placed"])
        _wait(ray, {place.remote(work, i): i for i in range(cfg.tasks) if i not in placed})
        return tasks.merge(work)
    finally:
        if started_here:
            ray.shutdown()


def _tokenize(cfg: BuildConfig, index: int, dest: Destination):
    """In a Ray worker: task `index` in a thread, its progress reports yielded as they come (a
    Ray streaming generator); its error, if any, raised at the end."""
    from longpack.pipeline.distribute.tasks import run_task

    reports: queue.Queue = queue.Queue()
    failed: list[BaseException] = []

    def work():
        try:
            run_task(cfg, index, report=reports.put, place=True, merge=False,
                     show_progress=False, dest=dest)
        except BaseException as e:  # raised below, in the task itself
            failed.append(e)
        finally:
            reports.put(None)

    thread = threading.Thread(target=work, name=f"task-{index}")
    thread.start()
    while (progress := reports.get()) is not None:
        yield dataclasses.asdict(progress)
    thread.join()
    if failed:
        raise failed[0]


def _place(out: str, index: int) -> int:
    from longpack.pipeline.distribute.tasks import place_task

    place_task(out, index)
    return index


def _import_ray():
    try:
        import ray
    except ImportError:
        raise SettingsError(f"--engine ray needs Ray: {install_hint('ray')}") from None
    return ray


def _connect(ray, address: str | None) -> None:
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False)
    if address:
        _reachable(address)
    try:
        if address:
            ray.init(address=address, **quiet)
        else:  # a local cluster of this machine's cores, reachable on the loopback only
            ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", **quiet)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"--ray-address {address}" if address else "a local Ray cluster"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SettingsError(f"{where}: cannot connect ({first}); start the cluster with `ray "
                            "start --head` (and pass its address), or leave --ray-address out "
                            "for a local one") from None


def _reachable(address: str) -> None:
    """Fail at once where nothing listens (ray.init would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except ValueError:
        raise SettingsError(f"--ray-address {address}: give HOST:PORT of the cluster's head "
                            "(what `ray start --head` printed)") from None
    except OSError as e:
        raise SettingsError(f"--ray-address {address}: cannot connect ({e.strerror or e}); "
                            "start the cluster with `ray start --head` (and pass its address), "
                            "or leave --ray-address out for a local one") from None


def _check_cpus(ray, workers: int) -> None:
    """A task asks for --workers CPUs: more than the largest node has would wait forever."""
    largest = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")),
                  default=0)
    if workers > largest:
        raise SettingsError(f"--workers {workers}: each Ray task asks for that many CPUs and the "
                            f"largest node of the cluster has {largest:g}; pass --workers "
                            f"{max(1, int(largest))} or less")


def _input_bytes(cfg: BuildConfig) -> int | None:
    from longpack.pipeline.read.catalog import get_dataset
    from longpack.pipeline.read.inputs import InputFiles, expand_inputs

    if not cfg.inputs:
        return None
    files = InputFiles(expand_inputs(get_dataset(cfg.dataset), list(cfg.inputs)))
    return sum(size for _, size in files.files)


def _wait(ray, refs: dict, progress: Progress | None = None) -> None:
    """Until every task has ended (`refs`: object refs, or the streaming generators of tasks
    that yield their TaskProgress); the first task that failed stops the build with its error
    (the others are cancelled: what they did stays for a re-run to resume)."""
    latest: dict[int, dict] = {}
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=POLL_SECONDS)
            for ref in ready:
                index = refs[ref]
                if not isinstance(ref, ray.ObjectRefGenerator):
                    _result(ray, ref, index)
                    continue
                try:
                    latest[index] = _result(ray, next(ref), index)
                    pending.append(ref)
                except StopIteration:  # the task has ended
                    pass
            if progress is not None and latest:
                progress.update(*(sum(p[k] for p in latest.values())
                                  for k in ("documents", "tokens", "bytes_done")))
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        if progress is not None:
            progress.close()


def _result(ray, ref, index: int):
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else None
        if isinstance(cause, LongpackError):
            raise LongpackError(f"task {index}: {cause}") from None
        raise LongpackError(f"task {index} failed: {cause or e}") from None
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
            ray.exceptions.RaySystemError) as e:
        raise LongpackError(f"task {index}: its worker died {MAX_RETRIES + 1} times "
                            f"({type(e).__name__}); re-run the same command: finished tasks "
                            "are not redone, the others resume") from None

