"""A fixed workload timed beside a benchmark, so that readings from machines of different speed compare.

The same machine type runs about 2x faster or slower from one day to the next, and CPU types differ more.
A benchmark script times this workload in the same call and reports its own seconds next to it; two readings
then compare through their ratio to the calibration, not their raw seconds.

Two parts, each the median of a few repeats:
  python_s   interpreter-bound work of the kind DVC's and Snakemake's bookkeeping does: building, dumping and
             parsing nested dicts (JSON and YAML), hashing 64 MiB, sorting strings
  torch_s    the demo's kind of training step: a small convolutional network, forward and backward, on one
             thread at 32 px (None without torch)

    python scripts/calibration.py            # print both as JSON
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time


def _python_work() -> None:
    import yaml

    tree = {f"stage{i}": {"deps": [f"data/x/{i}/{j}.json" for j in range(8)], "md5": hashlib.md5(str(i).encode())
                          .hexdigest(), "params": {"lr": 0.01 * i, "seed": i}} for i in range(3000)}
    text = json.dumps(tree, sort_keys=True)
    assert json.loads(text) == tree
    small = {k: tree[k] for k in list(tree)[:300]}
    yaml.load(yaml.dump(small), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    hashlib.sha256(b"\0" * (64 << 20)).hexdigest()
    sorted(f"{i * 7919 % 100003:06d}/{i}" for i in range(300_000))


def _torch_work() -> None:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, stride=2, padding=1),
        torch.nn.ReLU(), torch.nn.Conv2d(64, 128, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 20))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(64, 3, 32, 32), torch.rand(64, 20)
    for _ in range(20):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(net(x), y).backward()
        opt.step()


def _median_seconds(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 3)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def calibrate(repeats: int = 3) -> dict:
    """Seconds of the fixed workloads on this machine now, with the CPU's name."""
    try:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            torch_s = _median_seconds(_torch_work, repeats)
        finally:
            torch.set_num_threads(threads)
    except ImportError:
        torch_s = None
    return {"python_s": _median_seconds(_python_work, repeats), "torch_s": torch_s, "cpu": _cpu_name(),
            "repeats": repeats}


if __name__ == "__main__":
    print(json.dumps(calibrate(), indent=1))
