"""What a params.yaml method block may say, per family: option schemas, defaults and cross-field rules.

Torch-free on purpose: params validation (every Snakemake start, every data step) checks method blocks
without importing any training code. The method modules read their schemas and defaults from here.
"""

from __future__ import annotations

from noisymlt.data.labels import GROUPS
from noisymlt.errors import NoisyMLTError
from noisymlt.losses import LOSSES
from noisymlt.models.choices import ADJACENCIES, BBN_SPLITS, POOLINGS
from noisymlt.core.schema import ParamsError, check_schema

# ------------------------------------------------------------------ shared fragments
METHOD_COMMON_KEYS = ("family", "label", "description", "schedule", "train", "clean")
SAMPLER_NAMES = ["random", "class_aware", "reversed"]
LOSS_NAMES = list(LOSSES)  # the losses registry (a new loss module registers itself there)
SAMPLER_OPTION = {"sampler": {"enum": SAMPLER_NAMES}}
LOSS_OPTIONS = {"loss": {"enum": LOSS_NAMES}, "loss_params": {"type": "object"}}

# ------------------------------------------------------------------ single
HEADS = ("linear", "cosine")
SINGLE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {**SAMPLER_OPTION, **LOSS_OPTIONS, "head": {"enum": list(HEADS)}},
}


def check_single(opts: dict) -> None:
    scale = (opts.get("loss_params") or {}).get("scale", 30.0)
    if opts.get("loss") == "ldam" and opts.get("head", "linear") != "cosine" and scale != 1:
        # LDAM-DRW scales cosine logits in [-1, 1]; scaled linear logits saturate the loss.
        raise NoisyMLTError(f"loss ldam multiplies the logits by {scale}; use head: cosine (LDAM-DRW's "
                            "NormedLinear) or loss_params: {scale: 1} with a linear head")


# ------------------------------------------------------------------ bbn
BBN_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {**LOSS_OPTIONS, "split_at": {"enum": list(BBN_SPLITS)}},
}

# ------------------------------------------------------------------ mlgcn
MLGCN_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        **SAMPLER_OPTION,
        **LOSS_OPTIONS,
        "t": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "p": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
        "embeddings": {"enum": ["glove", "random"]},
        # filled in from assets.glove.<kind> (noisymlt.data.assets); set it to read other vectors
        "embeddings_file": {"type": ["string", "null"], "minLength": 1},
        "adjacency": {"enum": list(ADJACENCIES)},
        "pool": {"enum": list(POOLINGS)},
        "gcn_lr_mult": {"type": "number", "exclusiveMinimum": 0},
    },
}

# ------------------------------------------------------------------ dividemix
DIVIDEMIX_DEFAULTS = {
    "sampler": "class_aware",
    "warmup_epochs": "auto",  # see noisymlt.methods.dividemix
    "p_threshold": 0.5,
    "temperature": 0.5,
    "beta_alpha": 4.0,
    "lambda_u": 2.5,
    "rampup_epochs": 1.0,
    "gmm": {"max_iter": 10, "reg_covar": 5e-4, "tol": 1e-2},
}
DIVIDEMIX_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        **SAMPLER_OPTION,
        "warmup_epochs": {"anyOf": [{"type": "integer", "minimum": 0}, {"const": "auto"}]},
        "p_threshold": {"type": "number", "minimum": 0, "maximum": 1},
        "temperature": {"type": "number", "exclusiveMinimum": 0},
        "beta_alpha": {"type": "number", "exclusiveMinimum": 0},
        "lambda_u": {"type": "number", "minimum": 0},
        "rampup_epochs": {"type": "number", "exclusiveMinimum": 0},
        "gmm": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_iter": {"type": "integer", "minimum": 1},
                "reg_covar": {"type": "number", "exclusiveMinimum": 0},
                "tol": {"type": "number", "exclusiveMinimum": 0},
            },
        },
    },
}

# ------------------------------------------------------------------ colearning (Ours and its ablations)
BRANCH_NAMES = ("random", "balanced")  # f and g; the test-time ensemble weighs them tau : 1 - tau
BRANCH_DEFAULTS = {
    "random": {"sampler": "random", "loss": "bce", "loss_params": {}, "batch_size": "random", "dropout": 0.0},
    "balanced": {"sampler": "class_aware", "loss": "db_focal", "loss_params": {}, "batch_size": "balanced",
                 "dropout": 0.5},
}
STITCH_MODES = ("feature_average", "feature_concat", "image_concat")
NEGATIVE_TARGETS = ("own", "union")  # Stitch-Up negatives: each image's own labels ([CL]) or the union
PSEUDO_SOURCES = ("cross", "self", "none")
STITCHUP_DEFAULTS = {"enabled": True, "mode": "feature_average", "k": 2, "p": 1.0, "negatives": "own",
                     "partner_bn": True}
MIXUP_DEFAULTS = {"enabled": False, "alpha": 1.0}


def stitchup_option(method_block: dict, option: str) -> float:
    """The value of ``stitchup.<key>`` a method trains with (its block, else the default); K counts 1
    when Stitch-Up is off, as the trainer does."""
    section, _, key = option.partition(".")
    if section != "stitchup" or key not in STITCHUP_DEFAULTS:
        raise NoisyMLTError(f"sweep option {option!r}: expected stitchup.<{'|'.join(STITCHUP_DEFAULTS)}>")
    stitch = {**STITCHUP_DEFAULTS, **(method_block.get("stitchup") or {})}
    return stitched_views(stitch) if key == "k" else stitch[key]


def stitched_views(stitch: dict) -> int:
    """K, the views per training slot: the anchor alone when Stitch-Up is off (``stitch``: the method's
    resolved ``stitchup`` options)."""
    return int(stitch["k"]) if stitch["enabled"] else 1


# batch_size names the train setting a branch's stream uses
BATCH_SIZE_KEYS = {"random": "batch_size", "balanced": "balanced_batch_size"}

_GROUP_VALUES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {g: {"type": ["number", "null"], "minimum": 0, "maximum": 1} for g in GROUPS},
}
THRESHOLDS_SCHEMA = {
    "description": "per source branch (whose predictions correct the peer's labels): alpha and beta per "
                   "class group; a missing group is off",
    "type": "object",
    "propertyNames": {"enum": list(BRANCH_NAMES)},
    "additionalProperties": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"alpha": _GROUP_VALUES, "beta": _GROUP_VALUES},
    },
}
_BRANCH_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        **SAMPLER_OPTION,
        **LOSS_OPTIONS,
        "batch_size": {"enum": list(BATCH_SIZE_KEYS), "description": "which train batch size the stream uses"},
        "dropout": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    },
}


def _enabled(key: str) -> dict:
    """Schema fragment: options[key].enabled is given and true."""
    enabled = {"required": ["enabled"], "properties": {"enabled": {"const": True}}}
    return {"required": [key], "properties": {key: enabled}}


COLEARNING_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "branches": {
            "description": "branch name -> settings, merged over that branch's defaults; the names "
                           "given are the branches built (one branch = single-branch ablation)",
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"enum": list(BRANCH_NAMES)},
            "additionalProperties": _BRANCH_SCHEMA,
        },
        "shared_backbone": {"type": "boolean", "description": "paper text: one backbone; [CL]: two"},
        "stitchup": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "enabled": {"type": "boolean"},
                "mode": {"enum": list(STITCH_MODES)},
                "k": {"type": "integer", "minimum": 2, "maximum": 5},
                "p": {"type": "number", "minimum": 0, "maximum": 1},
                "negatives": {"enum": list(NEGATIVE_TARGETS)},
                "partner_bn": {"type": "boolean"},
            },
        },
        "mixup": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"enabled": {"type": "boolean"}, "alpha": {"type": "number", "exclusiveMinimum": 0}},
        },
        "pseudo": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "source": {"enum": list(PSEUDO_SOURCES)},
                "thresholds": {"oneOf": [{"type": "null"}, THRESHOLDS_SCHEMA]},
            },
        },
    },
    "allOf": [
        {  # Mix-Up replaces Stitch-Up (which is on by default)
            "if": _enabled("mixup"),
            "then": {"required": ["stitchup"],
                     "properties": {"stitchup": {"required": ["enabled"],
                                                 "properties": {"enabled": {"const": False}}}}},
        },
        {  # one branch has no peer to learn from
            "if": {"required": ["branches"], "properties": {"branches": {"maxProperties": 1}}},
            "then": {"required": ["pseudo"],
                     "properties": {"pseudo": {"required": ["source"],
                                               "properties": {"source": {"enum": ["self", "none"]}}}}},
        },
    ],
}


def check_colearning(opts: dict) -> None:
    """Cross-field rules (also in the schema, where their messages are less clear); types are left
    to the schema check that follows."""

    def section(key: str) -> dict:
        value = opts.get(key)
        return value if isinstance(value, dict) else {}

    stitch_on = section("stitchup").get("enabled", STITCHUP_DEFAULTS["enabled"])
    mixup_on = section("mixup").get("enabled", MIXUP_DEFAULTS["enabled"])
    if stitch_on is True and mixup_on is True:
        raise NoisyMLTError("colearning options: mixup.enabled and stitchup.enabled are exclusive "
                            "(Mix-Up replaces Stitch-Up); set stitchup.enabled: false")
    branches = section("branches") or BRANCH_DEFAULTS
    source = section("pseudo").get("source", "cross")
    if len(branches) == 1 and source == "cross":
        raise NoisyMLTError("colearning options: pseudo.source 'cross' needs two branches; with one branch "
                            "set pseudo.source to 'self' or 'none'")


def losses_used(family: str, opts: dict) -> list[str]:
    """The loss names a method block trains with: a run's code depends on those loss modules only.
    (tests/test_methods_registry.py checks this against the losses each family really builds.)"""
    if family in ("single", "bbn", "mlgcn"):
        return [opts.get("loss", "bce")]
    if family == "dividemix":
        return ["bce"]
    if family == "colearning":
        branches = opts.get("branches") or {name: {} for name in BRANCH_NAMES}
        return sorted({{**BRANCH_DEFAULTS[name], **(given or {})}["loss"] for name, given in branches.items()})
    family_schema(family)  # an unknown family is refused here
    return sorted(LOSSES)  # a family added since: it may build any loss, so its runs depend on every loss module


# ------------------------------------------------------------------ per family
SCHEMAS = {
    "single": SINGLE_SCHEMA,
    "bbn": BBN_SCHEMA,
    "mlgcn": MLGCN_SCHEMA,
    "dividemix": DIVIDEMIX_SCHEMA,
    "colearning": COLEARNING_SCHEMA,
}
CROSS_FIELD = {"single": check_single, "colearning": check_colearning}


def family_schema(family: str) -> dict:
    """The option schema of ``family``: one of SCHEMAS, or for a family module added since, its top-level
    ``OPTIONS_SCHEMA = {...}`` literal (read from the source: this module stays torch-free); a family module
    without one takes no options."""
    if family in SCHEMAS:
        return SCHEMAS[family]
    import ast
    import importlib.util
    from pathlib import Path

    from noisymlt.methods import FAMILY_MODULES

    if family not in FAMILY_MODULES:
        raise NoisyMLTError(f"unknown family {family!r}; known: {', '.join(sorted(FAMILY_MODULES))}")
    path = importlib.util.find_spec(FAMILY_MODULES[family]).origin
    for node in ast.parse(Path(path).read_text(), filename=path).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "OPTIONS_SCHEMA" for t in node.targets):
            return ast.literal_eval(node.value)
    return {"type": "object", "additionalProperties": False, "properties": {}}


def check_options(family: str, options: dict, key: str, where: str | None = None) -> None:
    """A method block's family options (everything but family, label, description, schedule, train), the block
    being at dotted path ``key`` of the params file ``where``: cross-field rules first (their messages are
    clearer), then the family's schema."""
    try:
        schema = family_schema(family)
    except NoisyMLTError as exc:
        raise ParamsError(where, f"{key}.family", str(exc)) from exc
    rule = CROSS_FIELD.get(family)
    if rule is not None:
        try:
            rule(options)
        except NoisyMLTError as exc:
            raise ParamsError(where, key, str(exc)) from exc
    check_schema(options, schema, key, where)


def method_options(block: dict) -> dict:
    """A method block's family options: everything but family, label, description, schedule, train and clean."""
    return {k: v for k, v in block.items() if k not in METHOD_COMMON_KEYS}
