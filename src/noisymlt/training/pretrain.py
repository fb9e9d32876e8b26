"""The embedded analogue of ImageNet pretraining: a backbone trained once on a synthetic source task.

The paper fine-tunes an ImageNet ResNet-50; the demo fine-tunes a small ResNet pretrained here. The
source task is clean, single-label glyph classification over classes *disjoint* from the 20 toy
target classes: other (shape, colour, texture) combinations drawn with the toy dataset's own renderer
on the same kind of backgrounds, as ImageNet's classes are other classes than VOC's on photos alike.
Training is ordinary supervised pretraining (every layer and BatchNorm trains, softmax cross-entropy,
SGD with a cosine learning rate); the output is a torchvision-layout state dict (conv1, bn1, layer1-4,
fc) that ``train.weights_path`` loads exactly as it loads ImageNet weights, so fine-tuning takes the
paper-scale code path ([CL]'s frozen stages and BatchNorm) with only sizes changed.

Images are kept as JPEG bytes in memory (a few MB) and decoded per batch with the fine-tuning
transforms. Everything is a function of the config: the same config gives the same weights on CPU.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import logging
import math
import time
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError
from noisymlt.core.files import replacing

log = logging.getLogger(__name__)

DEFAULTS = {
    "backbone": "resnet_tiny",
    "source": {"seed": 0, "classes": 48, "images_per_class": 100, "held_out_per_class": 20, "size": 64},
    "image_size": 32,
    "epochs": 12,
    "batch_size": 64,
    "lr": 0.1,
    "weight_decay": 0.0005,
    "cpu_threads": 2,
    "cpu_precision": "fp32",  # or bf16: the step under autocast (fast only on a CPU with bf16 units)
    "photometric": True,  # mmcv's photometric distortion (train.photometric); its colour ops change a glyph's class
}
TEXTURES = ("solid", "hstripes", "vstripes", "checker")


def resolve(config: dict) -> dict:
    """The pretraining block with defaults filled in (the schema in params.schema.yaml checks ranges)."""
    unknown = sorted(set(config) - set(DEFAULTS) - {"description"})
    if unknown:
        raise NoisyMLTError(f"pretrain: unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    return {**DEFAULTS, **config, "source": {**DEFAULTS["source"], **config.get("source", {})}}


def source_glyphs(n_classes: int, seed: int):
    """``n_classes`` glyphs (shape x colour x texture) none of which is a toy target class, in a
    seeded random order: the source task's classes."""
    from noisymlt.data.toy import COLOURS, GLYPHS, Glyph

    targets = {(g.shape, g.colour, g.texture) for g in GLYPHS}
    shapes = sorted({g.shape for g in GLYPHS})
    pool = [combo for combo in itertools.product(shapes, sorted(COLOURS), TEXTURES) if combo not in targets]
    if not 2 <= n_classes <= len(pool):
        raise NoisyMLTError(f"pretrain.source.classes: need 2..{len(pool)} source classes, got {n_classes}")
    order = np.random.default_rng(seed).permutation(len(pool))[:n_classes]
    return tuple(Glyph(f"{pool[i][1]}_{pool[i][2]}_{pool[i][0]}", *pool[i]) for i in order)


def make_source_set(source: dict):
    """(glyphs, train JPEGs, train labels, held-out JPEGs, held-out labels): one glyph per image."""
    from noisymlt.data.toy import _render

    glyphs = source_glyphs(source["classes"], source["seed"])
    rng = np.random.default_rng([source["seed"], 1])
    per_class = source["images_per_class"] + source["held_out_per_class"]
    labels = np.repeat(np.arange(len(glyphs)), per_class)
    rng.shuffle(labels)
    images = [_render(rng, [int(c)], source["size"], glyphs)[0] for c in labels]
    held = np.zeros(len(labels), dtype=bool)  # the first held_out_per_class images of each class
    for c in range(len(glyphs)):
        held[np.flatnonzero(labels == c)[:source["held_out_per_class"]]] = True
    train = [img for img, h in zip(images, held) if not h], labels[~held]
    test = [img for img, h in zip(images, held) if h], labels[held]
    return glyphs, *train, *test


def _decode(jpeg: bytes):
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as img:
        return img.convert("RGB")


def build_network(backbone: str, num_classes: int):
    """A torchvision-layout classifier network whose state dict ``build_backbone`` loads."""
    import torchvision

    from noisymlt.models.backbones import TINY_WIDTHS, TinyResNet

    if backbone in TINY_WIDTHS:
        return TinyResNet(num_classes, widths=TINY_WIDTHS[backbone])
    if backbone in ("resnet18", "resnet50"):
        return getattr(torchvision.models, backbone)(weights=None, num_classes=num_classes)
    raise NoisyMLTError(f"pretrain.backbone: unknown backbone {backbone!r}; choose resnet_tiny, resnet_tiny_half, resnet18 or resnet50")


def accuracy(net, images: list[bytes], labels: np.ndarray, size: int, batch: int = 256) -> float:
    import torch

    from noisymlt.training.transforms import eval_transform

    net.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(images), batch):
            x = torch.stack([eval_transform(_decode(b), size) for b in images[i:i + batch]])
            correct += int((net(x).argmax(1).numpy() == labels[i:i + batch]).sum())
    return correct / max(len(images), 1)


def pretrain(config: dict, out: Path, progress: bool = True) -> dict:
    """Train the source task and write ``out`` (state dict) and ``out``.json (what was trained, how well)."""
    import torch
    from tqdm import tqdm

    from noisymlt.training.devices import autocast
    from noisymlt.training.transforms import train_transform

    cfg = resolve(config)
    torch.set_num_threads(cfg["cpu_threads"])
    torch.set_flush_denormal(True)
    t0 = time.time()
    glyphs, train_x, train_y, test_x, test_y = make_source_set(cfg["source"])
    log.info("source task: %d classes, %d train / %d held-out images rendered in %.1f s", len(glyphs), len(train_x),
             len(test_x), time.time() - t0)
    torch.manual_seed(cfg["source"]["seed"])
    # channels-last (NHWC) runs the small convolutions about twice as fast on CPU; the saved state dict is the same
    net = build_network(cfg["backbone"], len(glyphs)).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=cfg["lr"], momentum=0.9, weight_decay=cfg["weight_decay"],
                          nesterov=True)
    iters = len(train_x) // cfg["batch_size"]
    if iters < 1:
        raise NoisyMLTError(f"pretrain.batch_size={cfg['batch_size']} exceeds the {len(train_x)} source images")
    total = iters * cfg["epochs"]
    decoded = [_decode(b) for b in train_x]  # once, not once an epoch (~35 MB for the demo's 2,880 images)
    history = []
    for epoch in range(cfg["epochs"]):
        net.train()
        rng = np.random.default_rng([cfg["source"]["seed"], 2, epoch])
        order = rng.permutation(len(train_x))
        seeds = rng.integers(0, 2**63 - 1, size=len(train_x))
        loss_sum = 0.0
        bar = tqdm(range(iters), desc=f"pretrain epoch {epoch + 1}/{cfg['epochs']}", disable=not progress, leave=False)
        for it in bar:
            idx = order[it * cfg["batch_size"]:(it + 1) * cfg["batch_size"]]
            x = torch.stack([train_transform(decoded[i], cfg["image_size"], np.random.default_rng(seeds[i]),
                                             photometric=cfg["photometric"]) for i in idx]).contiguous(memory_format=torch.channels_last)
            y = torch.as_tensor(train_y[idx], dtype=torch.long)
            step = epoch * iters + it
            for group in opt.param_groups:  # cosine decay to 0 over the whole run
                group["lr"] = cfg["lr"] * 0.5 * (1 + math.cos(math.pi * step / total))
            with autocast(torch.device("cpu"), cfg["cpu_precision"]):
                loss = torch.nn.functional.cross_entropy(net(x).float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.item()
        record = {"epoch": epoch + 1, "loss": round(loss_sum / iters, 5)}
        history.append(record)
        log.info("pretrain epoch %d/%d loss %.4f", epoch + 1, cfg["epochs"], record["loss"])
    report = {
        "config": cfg,
        "source_classes": [g.name for g in glyphs],
        "num_train": len(train_x),
        "num_held_out": len(test_x),
        "held_out_accuracy": round(accuracy(net, test_x, test_y, cfg["image_size"]), 5),
        "history": history,
    }
    log.info("held-out source accuracy %.4f (chance %.4f); %.0f s in all", report["held_out_accuracy"],
             1 / len(glyphs), time.time() - t0)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as tmp:
        torch.save(net.state_dict(), tmp)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def _run(args: argparse.Namespace) -> int:
    from noisymlt.core.codedeps import CLI
    from noisymlt.core.files import json_object_arg
    from noisymlt.core.manifest import now, write_manifest

    started, out = now(), Path(args.out)
    report = pretrain(json_object_arg(args.config, "--config"), out, progress=not args.no_progress)
    # the weights' record, which every training run checks them against before it fine-tunes from them
    write_manifest(out.with_name(out.stem + ".manifest.json"), step="pretrain", started=started, inputs={},
                   outputs={"weights": out, "report": out.with_suffix(".json")}, code=(*CLI, __name__))
    print(f"{args.out}: {report['config']['backbone']} on {len(report['source_classes'])} source classes, "
          f"held-out accuracy {report['held_out_accuracy']:.3f}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "pretrain", help="pretrain a backbone on the synthetic source task (the demo's ImageNet)",
        description="Render a clean single-label glyph classification task whose classes are disjoint from the "
                    "toy dataset's, train a backbone on it from scratch and write its state dict (torchvision "
                    "layout) to OUT and a report (source classes, held-out accuracy, loss per epoch) to OUT with "
                    ".json. Point train.weights_path at OUT to fine-tune from it.",
    )
    p.add_argument("--config", required=True,
                   help="a pretrain block of params.yaml as JSON text or a JSON file (keys: " + ", ".join(DEFAULTS) + ")")
    p.add_argument("--out", required=True, help="weights file to write, e.g. data/pretrained/toy_glyphs.pt")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
