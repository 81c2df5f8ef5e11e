"""A rank entry point for the harness's own test (tests/test_cluster.py): `python -m tests.support.busy_rank JOB RANK
OUT` burns 0.3 s of CPU, then writes its rank, process id, RANK from its environment and folder to OUT."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    _, rank, out = sys.argv[1:4]
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:
        pass
    with open(out, "w") as f:
        json.dump({"rank": int(rank), "pid": os.getpid(), "env_rank": os.environ["RANK"], "cwd": os.getcwd()}, f)
    print(f"rank {rank} done")


if __name__ == "__main__":
    main()
