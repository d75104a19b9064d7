"""Work only rank 0 does (metrics.jsonl, uploads) that fails there stops every process of a run,
not rank 0 alone while the others wait for it in the next collective until a timeout."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent("""
    import os, sys
    import torch.distributed as dist
    from longpack.core.errors import LongpackError, OutputError
    from longpack.training.parallel import distributed

    dist.init_process_group("gloo")
    procs = distributed.launched()
    try:
        with distributed.failing_together(procs):
            if procs.main:
                raise OutputError("metrics.jsonl: No space left on device")
        distributed.summed(__import__("torch").ones(1), procs)  # the next step's collective
        print(f"rank {procs.rank}: carried on", flush=True)
    except LongpackError as e:
        print(f"rank {procs.rank}: {e}", flush=True)
    dist.destroy_process_group()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_failure_on_rank_0_alone_stops_both_processes_without_a_hang(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            p.kill()
    assert "rank 0: metrics.jsonl: No space left on device" in outs[0], outs
    assert "rank 1: another process of this run failed" in outs[1], outs
