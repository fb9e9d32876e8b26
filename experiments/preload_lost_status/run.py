"""Do served commands lose their exit status on a busy machine? (issue 70)

Starts a preload server, keeps four busy loops on the machine, and runs N `noisymlt --version` commands through
the server, eight at a time; counts those that failed or said anything about the server. Prints a JSON line
(the server module's git blob, the CPU, the counts); `--json FILE` appends it there.

    python experiments/preload_lost_status/run.py --commands 200 --json experiments/preload_lost_status/result.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from noisymlt.pipeline import preload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    path, proc = preload.start_server(idle_timeout=120)
    burn = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    env = {**os.environ, preload.ENV: path}

    def lost(_) -> bool:
        r = subprocess.run([sys.executable, "-m", "noisymlt", "--version"], env=env, capture_output=True, text=True)
        return r.returncode != 0 or "preload server" in r.stderr

    try:
        with ThreadPoolExecutor(8) as pool:
            bad = sum(pool.map(lost, range(args.commands)))
    finally:
        for b in burn:
            b.kill()
        preload.stop_server(path, proc)
    # the server's code as its blob (what `git log --find-object` finds), whatever commit the tree is at
    blob = subprocess.run(["git", "hash-object", preload.__file__], capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else ""
    record = {"preload_py_blob": blob, "cpu": cpu, "cores": os.cpu_count(), "commands": args.commands, "lost": bad}
    print(json.dumps(record))
    if args.json:
        records = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps(records + [record], indent=1) + "\n")


if __name__ == "__main__":
    main()
