#!/usr/bin/env python
"""Where a `pack build`'s CPU goes: CPU seconds per thread kind, from the kernel's own accounting.

Runs `pack build ARGS...` in this process and samples /proc/self/task/*/stat every 50 ms, naming
each thread by its Python thread name (MainThread, read, tokenize_N, write_N, load-fastokens_N)
or, for threads Python did not start (fastokens' own BPE threads, zstd's, rayon's), by the
kernel's name for it. Prints wall seconds, the process's CPU seconds and the CPU seconds of each
kind (a thread that ended between two samples loses at most its last 50 ms). It measures
where the time goes, not how fast the build is: tools/bench_pack.py does that.

    .venv/bin/python tools/profile_build.py --dataset fineweb-edu --input CORPUS \\
        --tokenizer gpt2.tiktoken --seq 32768 --workers 2 --quiet --out /tmp/out
"""

import os
import re
import sys
import threading
import time
from collections import Counter

TICK = os.sysconf("SC_CLK_TCK")


class ThreadCpu(threading.Thread):
    def __init__(self):
        super().__init__(name="profile", daemon=True)
        self.cpu, self.names, self.stopped = {}, {}, threading.Event()

    def run(self):
        while not self.stopped.is_set():
            self.sample()
            time.sleep(0.05)

    def sample(self):
        python_names = {t.native_id: t.name for t in threading.enumerate()}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    stat = f.read()
            except FileNotFoundError:  # ended since the listing
                continue
            comm, rest = stat.split("(", 1)[1].rsplit(")", 1)
            fields = rest.split()
            tid = int(tid)
            self.cpu[tid] = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
            self.names.setdefault(tid, python_names.get(tid) or f"{comm} (native)")

    def by_kind(self) -> Counter:
        kinds = Counter()
        for tid, seconds in self.cpu.items():
            kinds[re.sub(r"_\d+$", "", self.names[tid])] += seconds
        return kinds


def main() -> int:
    from click.testing import CliRunner

    from longpack.pipeline.cli import pack

    watch = ThreadCpu()
    watch.start()
    t0, c0 = time.perf_counter(), time.process_time()
    result = CliRunner().invoke(pack, ["build", *sys.argv[1:]])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    watch.stopped.set()
    watch.join()
    watch.sample()
    if result.exit_code != 0:
        print(result.output, file=sys.stderr)
        return result.exit_code
    print(f"wall {wall:.2f} s, process CPU {cpu:.2f} s ({cpu / wall:.2f} cores)")
    for kind, seconds in watch.by_kind().most_common():
        if kind != "profile":
            print(f"  {kind:28} {seconds:7.2f} CPU s  {seconds / cpu:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
