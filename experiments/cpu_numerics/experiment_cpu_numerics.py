"""Does a precision make two CPU types agree, and what does each cost? (issue 36)

Two measurements on the machine it runs on, with that machine's numerics fingerprint and a calibration
(scripts/calibration.py) from the same call:

1. cost: CPU seconds of one demo training step (resnet_tiny from the pretrained source-task network at 32 px,
   batch 64, one thread, channels-last, SGD) under fp32 and under bf16 autocast;
2. kernels: the weights after 10 fp32 steps of that network, in fresh processes whose kernels are capped by
   oneDNN's ONEDNN_MAX_CPU_ISA and ATen's ATEN_CPU_CAPABILITY. If the weights change with the instruction set on
   one machine, fp32 alone cannot make machines with different instruction sets agree.

    python experiments/cpu_numerics/experiment_cpu_numerics.py --out experiments/cpu_numerics/result.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The kernel caps tried in fresh processes (None: the machine's own choice). Caps above what the CPU has change
# nothing, so on an AVX2 machine AVX2 is the top one.
CAPS = [{}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, {"ONEDNN_MAX_CPU_ISA": "SSE41"}, {"ATEN_CPU_CAPABILITY": "default"},
        {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default"}]


def network():
    import torch

    from noisymlt.training.pretrain import build_network

    torch.manual_seed(0)
    return build_network("resnet_tiny", 48).to(memory_format=torch.channels_last)


def step_seconds(precision: str, steps: int = 20) -> float:
    """Mean CPU seconds of one training step after 3 warm-up steps (one thread)."""
    import torch

    torch.set_num_threads(1)
    net = network()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 3, 32, 32, generator=gen).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 48, (64,), generator=gen)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = torch.nn.functional.cross_entropy(net(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    start = time.process_time()
    for _ in range(steps):
        step()
    return round((time.process_time() - start) / steps, 4)


def weights_digest() -> dict:
    """10 fp32 steps on fixed random batches; the digest of the weights and the last loss (run in a child)."""
    import torch

    torch.set_num_threads(1)
    net = network()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    for _ in range(10):
        x = torch.randn(64, 3, 32, 32, generator=gen).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 48, (64,), generator=gen)
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters())).hexdigest()[:16]
    return {"weights_sha256": digest, "last_loss": loss.item(), "aten": torch.backends.cpu.get_cpu_capability()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(weights_digest()))
        return 0
    sys.path.insert(0, str(ROOT / "scripts"))
    from calibration import calibrate

    from noisymlt.report.sentinels import describe
    from noisymlt.training.numerics import cpu_model, fingerprint

    kernels = []
    for cap in CAPS:
        out = subprocess.run([sys.executable, __file__, "--out", "-", "--child"], env={**os.environ, **cap},
                             capture_output=True, text=True, check=True).stdout
        kernels.append({"env": cap, **json.loads(out)})
    cost = {prec: step_seconds(prec) for prec in ("fp32", "bf16")}
    fps = {prec: {**fingerprint("cpu", prec, 1), "cpu": cpu_model()} for prec in ("fp32", "bf16")}
    result = {
        "numerics": fps, "described": {k: describe(v) for k, v in fps.items()},
        "step_cpu_seconds": cost, "bf16_over_fp32": round(cost["bf16"] / cost["fp32"], 2),
        "fp32_weights_by_kernel_cap": kernels,
        "fp32_changes_with_kernels": len({k["weights_sha256"] for k in kernels}) > 1,
        "calibration": calibrate(),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
