"""A checkpoint of [CL]'s own training, converted into this project's two-branch model for Ours.

[CL] (github.com/VamosC/CoLearning-meet-StitchUp) saves mmcv checkpoints, ``{"meta": ..., "state_dict": ...,
"optimizer": ...}``, of its ``StitchUpClassifier`` (mlltn/models/classifiers/stitchup.py): the random branch is
``backbone`` / ``neck`` / ``head``, the balanced one ``backbone1`` / ``neck1`` / ``head1``. Its README links the
trained VOC-MLT-Noise-0.5 and COCO-MLT-Noise-0.5 models (``epoch_8.pth``, Google Drive, section "Pre-trained
models"). Both are the same network as ours, key by key:

- backbone: mmcv's ResNet-50 (mllt/models/backbones/resnet.py, ``style='pytorch'``: stride in the 3x3 conv, as
  torchvision's), keys ``conv1``, ``bn1``, ``layer{1-4}.{j}.{conv1-3,bn1-3,downsample.0,downsample.1}``, no
  classifier; ours is torchvision's ResNet-50 with the stem held as ``stem.0`` (conv1) and ``stem.1`` (bn1).
- neck: ``PFC`` (mllt/models/necks/pfc.py): global average pool -> ``fc`` -> ``bn`` (BatchNorm1d) -> dropout, as our
  ``Neck``. Its ``bn2`` normalises the Stitch-Up partner's features in training (``x2``), which is our optional
  partner BatchNorm (``partner_bns.<branch>``): mapped when the model has them, else dropped (inference never uses
  it). Its ``fc_hidden_1`` runs only with ``layers=2``; both of [CL]'s configs use the default 1: dropped.
- head: ``ClsHead`` with ``method='fc'`` (both configs): ``fc_cls`` -> our ``head.fc``. The state dict cannot
  tell a cosine head ('cos', same keys) apart; [CL] uses none.

The test-time ensemble is the same too: [CL]'s ``simple_test`` returns ``alpha * random + (1 - alpha) * balanced``
with ``test_cfg.alpha = 0.1``, ours ``ensemble_logits`` with tau = 0.1. [CL] normalises 0-255 images with
ImageNet's mean and std times 255, the same map as torchvision's on 0-1 images.

Every key is mapped by an explicit rule; a key no rule names, a key the model needs that the file lacks, or a
shape that differs is an error naming them. The file is read with ``torch.load(weights_only=True)``: tensors and
plain containers only, no code runs.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from noisymlt.errors import NoisyMLTError, cause

if TYPE_CHECKING:  # torch is imported where it is used: `noisymlt --help` and the data steps stay torch-free
    import torch

    from noisymlt.models.twobranch import TwoBranch

# [CL]'s module suffix -> our branch (noisymlt.methods.options.BRANCH_NAMES): "" is f (uniform sampling), "1" is g
# (class-aware sampling: data.sampler1 = 'ClassAware' in its configs)
CL_BRANCHES = {"": "random", "1": "balanced"}
# [CL]'s neck dropout per branch (configs/{voc,coco}/LT_dual_resnet50.py: neck 0, neck1 0.5); eval ignores it
CL_DROPOUT = {"random": 0.0, "balanced": 0.5}
# [CL]'s test_cfg.alpha (both configs): simple_test returns alpha * random + (1 - alpha) * balanced, our tau
CL_TEST_ALPHA = 0.1
# blocks per stage, and whether blocks are bottlenecks (conv3): the ResNets both [CL]'s code and ours build
ARCHITECTURES = {"resnet50": ((3, 4, 6, 3), True), "resnet18": ((2, 2, 2, 2), False)}
PRETRAINED_MODELS = ("[CL]'s README, section 'Pre-trained models', links epoch_8.pth of VOC-MLT-Noise-0.5 "
                     "(drive.google.com/file/d/1eGBGqB0BfjMEpXEijBot8Hg7cCM831xr) and COCO-MLT-Noise-0.5 "
                     "(drive.google.com/file/d/1jcRDj_QLybUVAM4ic_dsXBQv2t7K7l1b)")
_BN = "weight|bias|running_mean|running_var|num_batches_tracked"  # a BatchNorm's tensors


def _rules(branch: str, suffix: str, partner_bn: bool) -> list[tuple[re.Pattern, str | None]]:
    """(pattern over [CL]'s key, our key template or None = dropped on purpose) for one branch."""
    ours = f"branches.{branch}."
    s = re.escape(suffix)
    return [
        (re.compile(rf"backbone{s}\.conv1\.weight"), ours + "backbone.stem.0.weight"),
        (re.compile(rf"backbone{s}\.bn1\.({_BN})"), ours + r"backbone.stem.1.\1"),
        (re.compile(rf"backbone{s}\.(layer[1-4]\.\d+\.(?:conv[1-3]\.weight|bn[1-3]\.(?:{_BN})"
                    rf"|downsample\.0\.weight|downsample\.1\.(?:{_BN})))"), ours + r"backbone.\1"),
        (re.compile(rf"neck{s}\.fc\.(weight|bias)"), ours + r"neck.fc.\1"),
        (re.compile(rf"neck{s}\.bn\.({_BN})"), ours + r"neck.bn.\1"),
        (re.compile(rf"neck{s}\.bn2\.({_BN})"), rf"partner_bns.{branch}.\1" if partner_bn else None),
        (re.compile(rf"neck{s}\.fc_hidden_1\.(weight|bias)"), None),
        (re.compile(rf"head{s}\.fc_cls\.(weight|bias)"), ours + r"head.fc.\1"),
    ]


def read_cl_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The state dict and meta of an mmcv checkpoint (or a bare state dict), loaded with weights_only=True;
    a ``module.`` prefix (a model saved inside DataParallel) is removed, as mmcv's loader does."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise NoisyMLTError(f"{path}: [CL] checkpoint does not exist ({PRETRAINED_MODELS})")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for a disallowed global, RuntimeError for a damaged archive, ...
        raise NoisyMLTError(f"{path}: not readable as a checkpoint of tensors and plain containers "
                            f"(torch.load weights_only=True: {cause(exc)})") from exc
    if not isinstance(obj, dict):
        raise NoisyMLTError(f"{path}: holds a {type(obj).__name__}, not an mmcv checkpoint (a dict with state_dict)")
    state = obj.get("state_dict", obj)
    meta = obj.get("meta") if isinstance(obj.get("meta"), dict) else {}
    if (not isinstance(state, dict) or not state or not all(isinstance(k, str) for k in state)
            or not all(isinstance(v, torch.Tensor) for v in state.values())):
        raise NoisyMLTError(f"{path}: 'state_dict' is not a mapping of names to tensors")
    if all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return dict(state), dict(meta)


def infer_architecture(state: dict[str, torch.Tensor], source: str = "checkpoint") -> dict:
    """Backbone, classes and neck width of a [CL] state dict: what to build before loading it."""
    for key in ("backbone.conv1.weight", "neck.fc.weight", "head.fc_cls.weight", "backbone1.conv1.weight"):
        if key not in state:
            raise NoisyMLTError(f"{source}: no key {key!r}; not a state dict of [CL]'s two-branch StitchUpClassifier")
    for key in ("neck.fc.weight", "head.fc_cls.weight"):  # their first dimension sizes the model
        if state[key].dim() != 2:
            raise NoisyMLTError(f"{source}: {key} has shape {tuple(state[key].shape)}; a linear layer's weight is "
                                "2-D (outputs x inputs)")
    blocks = tuple(len({int(m.group(1)) for k in state if (m := re.match(rf"backbone\.layer{i}\.(\d+)\.", k))})
                   for i in range(1, 5))
    bottleneck = any(re.match(r"backbone\.layer1\.0\.conv3\.", k) for k in state)
    names = [name for name, arch in ARCHITECTURES.items() if arch == (blocks, bottleneck)]
    if not names:
        raise NoisyMLTError(f"{source}: a ResNet with {blocks} blocks per stage "
                            f"({'bottleneck' if bottleneck else 'basic'} blocks); this project builds only "
                            f"{', '.join(ARCHITECTURES)}")
    return {"backbone": names[0], "num_classes": int(state["head.fc_cls.weight"].shape[0]),
            "neck_dim": int(state["neck.fc.weight"].shape[0])}


def convert_state_dict(state: dict[str, torch.Tensor], model: TwoBranch, source: str = "checkpoint"
                       ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``model``'s state dict filled from [CL]'s ``state``, and the [CL] keys dropped on purpose. Errors name the
    keys no rule maps, the keys the model needs that ``state`` lacks, and shape mismatches."""
    import torch

    if set(model.branches) != set(CL_BRANCHES.values()):
        raise NoisyMLTError(f"{source}: [CL]'s model has the branches {sorted(CL_BRANCHES.values())}; the target "
                            f"model has {sorted(model.branches)}")
    partner_bn = len(model.partner_bns) > 0
    rules = [r for suffix, branch in CL_BRANCHES.items() for r in _rules(branch, suffix, partner_bn)]
    target = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    unmapped, dropped, shapes = [], [], []
    for key, value in state.items():
        hits = [(p, t) for p, t in rules if p.fullmatch(key)]
        if not hits:
            unmapped.append(key)
            continue
        assert len(hits) == 1, (key, hits)  # the rules never overlap
        pattern, template = hits[0]
        if template is None:
            dropped.append(key)
            continue
        ours = pattern.fullmatch(key).expand(template)
        if ours not in target:
            unmapped.append(f"{key} (-> {ours}, which the model lacks)")
        elif tuple(value.shape) != tuple(target[ours].shape):
            shapes.append(f"{key} {tuple(value.shape)} -> {ours} {tuple(target[ours].shape)}")
        else:
            out[ours] = value.to(target[ours].dtype)
    if unmapped:
        raise NoisyMLTError(f"{source}: {len(unmapped)} key(s) of the checkpoint map to nothing in the model, "
                            f"first: {unmapped[:5]}")
    if shapes:
        raise NoisyMLTError(f"{source}: {len(shapes)} tensor(s) differ in shape, first: {shapes[:3]}")
    # BatchNorm's step counter: absent from checkpoints of torch < 0.4.1, and unused when momentum is set
    for k in target:
        if k not in out and k.endswith("num_batches_tracked"):
            out[k] = torch.zeros_like(target[k])
    missing = [k for k in target if k not in out]
    if missing:
        raise NoisyMLTError(f"{source}: the checkpoint lacks {len(missing)} tensor(s) the model needs, first: "
                            f"{missing[:5]}")
    if model.shared_backbone:  # one module, two names: both of [CL]'s backbones must be the same weights
        differ = [k for k in target if k.startswith("branches.random.backbone.")
                  and not torch.equal(out[k], out[k.replace(".random.", ".balanced.", 1)])]
        if differ:
            raise NoisyMLTError(f"{source}: [CL] trains two backbones (backbone, backbone1) and they differ "
                                f"(e.g. {differ[0]}); the target model shares one: build it with two")
    return {k: out[k] for k in target}, dropped


def load_cl_state_dict(model: TwoBranch, state: dict[str, torch.Tensor], source: str = "checkpoint") -> list[str]:
    """Load [CL]'s ``state`` into ``model`` (every tensor checked, see convert_state_dict) and recompute whether the
    two branches' frozen trunks are now one function; returns the keys dropped on purpose."""
    from noisymlt.models.twobranch import frozen_trunks_identical

    converted, dropped = convert_state_dict(state, model, source)
    model.load_state_dict(converted, strict=True)
    model.shares_frozen_trunk = frozen_trunks_identical(list(model.branches.values()))
    return dropped


def build_from_cl(state: dict[str, torch.Tensor], *, source: str = "checkpoint", partner_bn: bool = False,
                  trainable: str = "layer4", frozen_bn: bool = True) -> tuple[TwoBranch, list[str]]:
    """Our two-branch model of the checkpoint's architecture, with its weights; no pretrained file is read."""
    from noisymlt.models.twobranch import build_two_branch

    arch = infer_architecture(state, source)
    cfg = {"backbone": arch["backbone"], "pretrained": False, "weights_path": None, "neck_dim": arch["neck_dim"],
           "trainable": trainable, "frozen_bn": frozen_bn}
    model = build_two_branch(cfg, arch["num_classes"], dict(CL_DROPOUT), partner_bn=partner_bn)
    dropped = load_cl_state_dict(model, state, source)
    return model.eval(), dropped


def convert_checkpoint(path: str | Path, out: str | Path, *, partner_bn: bool = False) -> dict:
    """Write ``{"model": state dict, "meta": ...}`` of our model converted from [CL]'s checkpoint ``path``
    (atomically); returns the meta (architecture, source meta, dropped keys)."""
    import torch

    from noisymlt.core.files import check_outputs, replacing
    from noisymlt.core.manifest import file_sha256

    check_outputs({"--checkpoint": path}, {"--out": out})
    state, cl_meta = read_cl_checkpoint(path)
    model, dropped = build_from_cl(state, source=str(path), partner_bn=partner_bn)
    meta = {"source": Path(path).name, "source_sha256": file_sha256(path), **infer_architecture(state, str(path)),
            "branches": {branch: f"backbone{s}/neck{s}/head{s}" for s, branch in CL_BRANCHES.items()},
            "partner_bn": partner_bn, "dropped_keys": dropped,
            "cl_meta": {k: v for k, v in cl_meta.items() if isinstance(v, (str, int, float, bool))}}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as tmp:
        torch.save({"model": model.state_dict(), "meta": meta}, tmp)
    return meta


def _run(args: argparse.Namespace) -> int:
    meta = convert_checkpoint(args.checkpoint, args.out, partner_bn=args.partner_bn)
    print(f"{args.out}: {meta['backbone']} two-branch model, {meta['num_classes']} classes, from {meta['source']} "
          f"({len(meta['dropped_keys'])} training-only key(s) dropped)")
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert-cl-checkpoint",
        help="convert a checkpoint of [CL]'s code (epoch_8.pth) into this project's two-branch model",
        description=(
            "Read an mmcv checkpoint of [CL]'s StitchUpClassifier with torch.load(weights_only=True) and write "
            "the same network as this project's two-branch model (Ours): backbone/neck/head become the random "
            "branch, backbone1/neck1/head1 the balanced one; its outputs equal [CL]'s on the same images. "
            f"Where to get one: {PRETRAINED_MODELS}."),
    )
    p.add_argument("--checkpoint", required=True, type=Path,
                   help="[CL]'s checkpoint, e.g. work_dirs/voc_0.5/epoch_8.pth")
    p.add_argument("--out", required=True, type=Path, help="output file: {'model': state dict, 'meta': ...}")
    p.add_argument("--partner-bn", action="store_true",
                   help="keep the necks' bn2 as the partner BatchNorms (feature-average Stitch-Up training)")
    p.set_defaults(func=_run)
