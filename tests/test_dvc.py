"""DVC's view of the pipeline (dvc.yaml): it plans the jobs Snakemake plans, tracks the code each step
runs, and reads the params file `noisymlt params` merges. The real runs (demo under DVC, push, wipe, pull,
Snakemake then `dvc commit`) are in test_dvc_demo.py.

The DVC commands run in a copy of the project under tmp_path with its own DVC state, config and cache
folders, so nothing here touches the checkout's .dvc or the user's DVC settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DVC = BIN / "dvc"
SNAKEMAKE = BIN / "snakemake"
def _dvc_yaml() -> dict:
    """Every stage definition: dvc.yaml's and the run stages' (shard 00's: every shard file has the same)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    return {**stages, **yaml.safe_load((REPO / "workflow" / "dvc" / "runs" / "00" / "dvc.yaml").read_text())["stages"]}


def _shards(out: str | Path) -> dict:
    """dvc_runs_SHARD -> its block, from the shard files `noisymlt params --out OUT` writes beside OUT."""
    from noisymlt.pipeline.params import DVC_SHARDS, runs_file

    blocks = {}
    for i in range(DVC_SHARDS):
        blocks.update(json.loads(runs_file(out, f"{i:02d}").read_text()))
    return blocks


def _sharded(out: str | Path, part: str = "runs") -> dict:
    """Every run (or candidate: part) of a params file's shard files (dvc_runs_SHARD)."""
    return {k: v for shard in _shards(out).values() for k, v in shard[part].items()}


def _stage_body(stage: dict) -> dict:
    return stage.get("do", stage)


STEP_COMMANDS = {"select-choose": "select"}  # `noisymlt step X` runs noisymlt/pipeline/dvc_steps.py and X's command


def _commands(cmd: str | list[str]) -> list[str]:
    """The noisymlt commands a stage's command line(s) run: `step X` runs noisymlt/pipeline/dvc_steps.py and X's
    command."""
    if isinstance(cmd, list):
        return [c for line in cmd for c in _commands(line)]
    words = cmd.split()
    first = words[words.index("noisymlt") + 1]
    if first != "step":
        return [first]
    step = words[words.index("step") + 1]
    return ["step", STEP_COMMANDS.get(step, step)]


def _item_args(params_files: list[Path]) -> dict[str, set[str]]:
    """Stage -> the noisymlt commands its items' computed words (`${item.args}`) run, for these params files."""
    from noisymlt.config import load_params
    from noisymlt.pipeline.params import dvc_block
    from noisymlt.pipeline.steps import STEPS

    block = dvc_block(load_params(*params_files), [str(f) for f in params_files])
    for step in STEPS:  # the code digest an item's stage depends on is its own command's
        if step.args is not None:
            assert all(i["command"] == i["args"].split()[0] for i in block[step.over[len("${dvc."):-1]].values())
    return {step.name: {item["args"].split()[0] for item in block[step.over[len("${dvc."):-1]].values()}
            for step in STEPS if step.args is not None}


def test_every_stage_depends_on_the_code_digests_of_what_it_runs_and_on_no_source_file():
    """No hand-kept list of modules: each stage's code dependency is the digest file of the commands it
    runs (data/code/COMMAND.json, training: data/code/train/METHOD.json), written by `code_digests` from
    the static import closures (noisymlt.core.codedeps), the same digests Snakemake passes its jobs. A stage whose
    words depend on a dataset's kind (`${item.args}`) depends on the digest of its item's own command
    (`${item.command}`), a command of the table, at paper scale and in the demo; a noisy set on the digest of its
    noise model (data/code/noise/MODEL.json: its command and the model's module)."""
    from noisymlt.commands import COMMANDS as commands

    run_by_items: dict[str, set[str]] = {}
    for layers in ([REPO / "params.yaml"], [REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml",
                                             REPO / "workflow/profiles/demo/select_ours.yaml"]):
        for name, words in _item_args(layers).items():
            run_by_items.setdefault(name, set()).update(words)
    assert run_by_items["raw"] == {"make-toy", "download"} and run_by_items["parse_labels"] == {"parse"}
    for name, stage in _dvc_yaml().items():
        body = _stage_body(stage)
        deps = body.get("deps", [])
        if name == "code_digests":
            assert deps == ["src/noisymlt"] and "code-deps" in body["cmd"]
            continue
        if name == "params":  # the root: writes the file code_digests reads, so it hashes the package itself
            assert deps == [f"${{dvc.layer_files[{i}]}}" for i in range(4)] + ["src/noisymlt"]
            assert body["cmd"] == "${dvc.preload} python -m noisymlt params ${dvc.layer_args} --out dvc-params.json"
            continue
        assert not [d for d in deps if d.startswith("src/")], name
        code = sorted(d for d in deps if d.startswith("data/code/"))
        if body["cmd"].endswith("${item.args}"):  # the item's own command, or the one command every item runs
            run = run_by_items.pop(name)
            assert run <= set(commands), name
            expected = {"data/code/${item.command}.json"} if len(run) > 1 or set(code) == {
                "data/code/${item.command}.json"} else {f"data/code/{c}.json" for c in run}
        else:
            expected = {f"data/code/{c}.json" for c in _commands(body["cmd"])}
        if name == "noise":  # a noisy set's command and its noise model's module (step_code.noise_entries)
            assert run <= {"noise", "authors-noise"}, run
            expected = {"data/code/noise/${item.model}.json"}
        if name in ("train", "train_candidate"):  # the run's training code, then its evaluation (--evaluate)
            assert body["cmd"].endswith(" --evaluate")
            expected = {"data/code/step.json", "data/code/train/${item.method}.json", "data/code/evaluate.json"}
        assert set(code) == expected, name
        assert all(c.split("/")[-1].removesuffix(".json") in commands or "/train/" in c or "${item.command}" in c
                   or "/noise/" in c for c in code), name
    assert run_by_items == {}, f"stages with computed words that dvc.yaml does not run: {sorted(run_by_items)}"


def test_code_digest_files_change_only_for_the_steps_an_edit_touches(tmp_path):
    from noisymlt.pipeline import step_code
    from noisymlt.config import load_params

    params = load_params(REPO / "params.yaml")
    before = step_code.digests(params)
    assert before["train/erm"] == before["train/rs"]  # same family, same loss: same code
    assert before["train/erm"] != before["train/db"] == before["train/db_focal"]
    paths = step_code.write_digests(params, tmp_path / "code")
    stamps = {p: p.stat().st_mtime_ns for p in paths}
    step_code.write_digests(params, tmp_path / "code")  # unchanged digests: files untouched
    assert {p: p.stat().st_mtime_ns for p in paths} == stamps
    assert json.loads((tmp_path / "code" / "train" / "bbn.json").read_text())["code_digest"] == before["train/bbn"]


def test_params_file_for_dvc_is_the_layered_params_and_refuses_a_stale_merge(tmp_path, monkeypatch):
    """dvc-params.json = what Snakemake's --configfile layering gives, plus the lists dvc.yaml expands over;
    once a layer changes, every step refuses it and names the command that rewrites it."""
    from noisymlt.errors import NoisyMLTError
    from noisymlt.config import load_params, resolve_run
    from noisymlt.core.manifest import run_id
    from noisymlt.pipeline.params import DVC_SHARDS, shard_of, write

    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "demo.yaml").write_text((REPO / "workflow" / "profiles" / "demo" / "params.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    write(["params.yaml", "demo.yaml"], "dvc-params.json")
    assert load_params("dvc-params.json") == load_params("params.yaml", "demo.yaml")
    whole = json.loads(Path("dvc-params.json").read_text())
    block, runs, candidates = whole["dvc"], _sharded("dvc-params.json"), _sharded("dvc-params.json", "candidates")
    assert not [k for k in whole if k.startswith("dvc_runs_")]  # the lists are in their shard files, not here
    methods = ["erm", "focal", "rs", "rs_focal", "ldam", "bbn", "mlgcn", "dividemix", "db", "db_focal", "ours"]
    grid = [f"toy-{g}-{s}-{m}" for g in ("0.3", "0.5", "0.7", "0.9") for s in range(5) for m in methods]
    clean = [f"toy-0.0-{s}-{m}" for s in range(5) for m in ("erm", "rs", "db_focal", "ldam", "ours")]
    assert set(grid) < set(runs) and set(clean) < set(runs)  # the main grid and its clean column, then the ablations
    assert len(runs) == len(grid) + len(clean) + 24 * 3 and {f"toy-0.5-{s}-ours_no_both" for s in range(3)} < set(runs)
    # each run in the shard its key hashes to (a stable hash: a new run moves no other), each shard used,
    # every shard block carries the command prefix: the shared preload server, as the demo asks
    shards = _shards("dvc-params.json")
    assert list(shards) == [f"dvc_runs_{i:02d}" for i in range(DVC_SHARDS)]
    assert all(key in shards[f"dvc_runs_{shard_of(key)}"]["runs"] for key in runs)
    assert all(shard["runs"] for shard in shards.values())
    assert {shard["preload"] for shard in shards.values()} == {block["preload"]} == {"NOISYMLT_PRELOAD=shared"}
    # a stage whose words depend on the kind runs the words Snakemake's rule computes (noisymlt.pipeline.steps)
    assert block["caches"]["toy-test"] == {"dataset": "toy", "part": "test", "images": "data/raw/toy",
                                           "command": "cache-images",
                                           "args": "cache-images --labels data/toy/test_labels.parquet --images "
                                                   "data/raw/toy/VOCdevkit/TOY --size 40 --out data/toy/cache/test.npy "
                                                   "--no-progress"}
    assert block["parse_labels"]["toy-train_source"]["args"] == (
        "parse --format voc --source data/raw/toy/VOCdevkit/TOY --image-set trainval "
        "--out data/toy/train_source_labels.parquet")
    marker = "data/raw/toy/VOCdevkit/TOY/toy_manifest.json"  # the raw folder's marker file: a cheap placeholder
    assert runs["toy-0.5-0-erm"] == {"dataset": "toy", "gamma": 0.5, "noise": "", "seed": 0, "method": "erm",
                                              "raw_marker": marker, "images": marker, "raw": marker,  # loader: cache
                                              "weights": "data/pretrained/toy_glyphs.pt",
                                              "embeddings": marker,  # no asset file
                                              "config_key": "toy-0_5-0-erm", "choice": marker}
    assert block["assets"] == {}  # the demo reads no external file
    # the demo trains Ours with its recorded choice (selection.records): no candidate, and its runs read no choice
    assert runs["toy-0.5-0-ours"]["choice"] == marker
    assert candidates == {} and block["selections"] == {}
    # a noise stage for each of the grid's noisy sets
    assert list(block["noisy_sets"]) == [f"toy-{g}-{s}" for g in (0.3, 0.5, 0.7, 0.9, 0.0) for s in range(5)]
    # with the layer that selects Ours in the run: Ours' 4 + 12 candidates on each of two noisy sets; its final runs
    # depend on the last stage's choice
    (tmp_path / "select_ours.yaml").write_text((REPO / "workflow" / "profiles" / "demo" / "select_ours.yaml").read_text())
    write(["params.yaml", "demo.yaml", "select_ours.yaml"], "selecting.json")
    selecting = json.loads(Path("selecting.json").read_text())["dvc"]
    assert _sharded("selecting.json")["toy-0.5-0-ours"]["choice"] == "runs/toy/select/ours/stage2.choice.json"
    assert len(_sharded("selecting.json", "candidates")) == 32
    assert list(selecting["selections"]) == ["toy-ours-1", "toy-ours-2"]
    assert list(selecting["select_sets"]) == ["toy-0.5-0", "toy-0.5-1"]
    assert selecting["selections"]["toy-ours-2"]["previous"] == "runs/toy/select/ours/stage1.choice.json"
    # and a noise stage for a selection set outside the grid
    one_seed = yaml.safe_load(Path("demo.yaml").read_text())
    one_seed["grid"].update(gammas=[0.5], seeds=[0], clean_methods=[])
    Path("one_seed.yaml").write_text(yaml.safe_dump(one_seed))
    write(["params.yaml", "one_seed.yaml", "select_ours.yaml"], "one_seed_dvc.yaml")
    narrow = yaml.safe_load(Path("one_seed_dvc.yaml").read_text())["dvc"]
    assert {k: {f: v[f] for f in ("dataset", "gamma", "seed", "noise", "model")} for k, v in narrow["noisy_sets"].items()
            } == {f"toy-0.5-{s}": {"dataset": "toy", "gamma": 0.5, "seed": s, "noise": "", "model": "cooccurrence"}
                  for s in (0, 1)}
    # a train stage's one param: the run id of its resolved configuration
    assert block["run_configs"]["toy-0_5-0-erm"] == run_id(resolve_run(load_params("dvc-params.json"), "toy", "erm",
                                                                        0.5, 0))
    assert block["layer_args"] == "params.yaml demo.yaml"
    assert block["layer_files"] == ["params.yaml", "demo.yaml", "params.yaml", "params.yaml"]
    assert list(block["pretrain"]) == ["toy_glyphs"] and block["fetch_images"] == {}

    write(["params.yaml"], "paper.yaml")  # ImageNet weights and GloVe vectors: files the assets stages fetch
    paper_file = json.loads(Path("paper.yaml").read_text())
    paper = {**paper_file["dvc"], "runs": _sharded("paper.yaml")}
    assert paper["pretrain"] == {} and list(paper["fetch_images"]) == ["coco"]
    assert paper["raw"]["coco"]["args"] == "download --dataset coco --root data/raw/coco --retries 5"
    assert paper["preload"] == "NOISYMLT_PRELOAD="  # paper scale: a process per command
    assert paper["runs"]["coco-0.9-4-ours"]["images"] == "data/raw/coco/manifest.json"  # loader: cache
    assert paper["runs"]["voc-0.3-0-erm"]["weights"] == "data/assets/imagenet/resnet50-0676ba61.pth"
    assert paper["runs"]["voc-0.3-0-erm"]["embeddings"] == "data/raw/voc/manifest.json"
    assert paper["runs"]["coco-0.3-0-mlgcn"]["embeddings"] == "data/assets/glove/coco_glove_word2vec-a1215dd1.pkl"
    assert {k: {f: v[f] for f in ("path", "group", "name")} for k, v in paper["assets"].items()} == {
        "imagenet-resnet50": {"path": "data/assets/imagenet/resnet50-0676ba61.pth", "group": "imagenet",
                              "name": "resnet50"},
        "glove-voc": {"path": "data/assets/glove/voc_glove_word2vec-0ca7081a.pkl", "group": "glove", "name": "voc"},
        "glove-coco": {"path": "data/assets/glove/coco_glove_word2vec-a1215dd1.pkl", "group": "glove",
                       "name": "coco"}}
    assert paper["assets"]["glove-voc"]["args"].startswith("fetch-asset --url https://")

    # under train.loader pil a run reads image folders: they are its dependencies
    Path("files.yaml").write_text("train: {loader: pil}\n")
    write(["params.yaml", "files.yaml"], "files_dvc.json")
    files = _sharded("files_dvc.json")
    assert (files["coco-0.9-4-ours"]["images"], files["coco-0.9-4-ours"]["raw"]) == ("data/coco/train_images",
                                                                                   "data/raw/coco")
    assert files["voc-0.3-0-erm"]["images"] == files["voc-0.3-0-erm"]["raw"] == "data/raw/voc"
    # each params file has its own shard files (OUT-STEM-runs/): writing the two above left the demo's alone
    assert _sharded("dvc-params.json") == runs and Path("paper-runs/00.json").is_file()

    Path("demo.yaml").write_text(Path("demo.yaml").read_text() + "\n# edited\n")
    stale = "dvc-params.json is stale: demo.yaml changed.*`noisymlt params params.yaml demo.yaml --out dvc-params.json`"
    with pytest.raises(NoisyMLTError, match=stale):
        load_params("dvc-params.json")


def test_a_value_the_selection_chooses_reruns_no_stage_when_set_by_hand(tmp_path, monkeypatch):
    """Ours selects its lr (stage 1), then alpha x beta (stage 2). A hand-set lr does not reach its final runs or
    its stage-2 candidates (their lr comes from the stage-1 choice file, a dependency): the hashes their DVC
    stages track stay as they were. Its stage-1 candidates set lr themselves, so they keep theirs too; a
    threshold the selection does not choose (a schedule key) changes every Ours hash."""
    from noisymlt.pipeline.params import write

    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "demo.yaml").write_text((REPO / "workflow" / "profiles" / "demo" / "params.yaml").read_text())
    # Ours' selection in the run (the demo itself trains Ours with its recorded choice)
    (tmp_path / "select.yaml").write_text((REPO / "workflow" / "profiles" / "demo" / "select_ours.yaml").read_text())
    monkeypatch.chdir(tmp_path)

    def hashes(*layers):
        write(["params.yaml", "demo.yaml", "select.yaml", *layers], "out.json")
        block = json.loads(Path("out.json").read_text())["dvc"]
        return {k: v for k, v in {**block["run_configs"], **block["candidate_configs"]}.items() if "ours" in k}

    base = hashes()
    assert len(base) == 20 + 5 + 24 * 3 + 32  # Ours' final runs (noisy, clean), its ablation variants' (they take its values), candidates
    Path("lr.yaml").write_text("train: {lr: 0.05}\nmethods: {ours: {train: {lr: 0.3}}}\n")
    assert hashes("lr.yaml") == base
    Path("epochs.yaml").write_text("methods: {ours: {train: {epochs: 15}}}\n")
    changed = hashes("epochs.yaml")
    own = [k for k in base if k.endswith("-ours") or k.startswith("toy-ours-")]
    assert len(own) == 20 + 5 + 32 and all(changed[k] != base[k] for k in own)


def readme_dag(md: str) -> str:
    """`dvc dag --collapse-foreach-matrix --md` as the manual draws it (docs/dvc.md): one sorted `A --> B` line per
    edge, by stage name (the sixteen shards of `train` and of `train_candidate` drawn as one node each), without the
    edges from params and code_digests (they feed every stage) and without self-edges."""
    names = {node: stage_name(name) for node, name in re.findall(r'(node\d+)\["([^"]+)"\]', md)}  # shards: one family
    edges = sorted({(names[a], names[b]) for a, b in re.findall(r"(node\d+)-->(node\d+)", md)
                    if names[a] not in ("params", "code_digests") and a != b})
    return "```mermaid\nflowchart LR\n" + "".join(f"\t{a} --> {b}\n" for a, b in edges) + "```\n"


# ------------------------------------------------------------------------------------ with the CLIs

def _env(root: Path) -> dict:
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",  # `python` in dvc.yaml = this interpreter
        PYTHONPATH=str(root / "src"),  # the copied code, which is what the stages hash
        DVC_NO_ANALYTICS="1",
        DVC_SITE_CACHE_DIR=str(root / ".dvc-site-cache"),
        DVC_GLOBAL_CONFIG_DIR=str(root / ".dvc-global"),
        DVC_SYSTEM_CONFIG_DIR=str(root / ".dvc-system"),
    )
    env.pop("DVC_TEST", None)
    return env


def _run(args: list, root: Path, timeout: float = 300, expect: int = 0) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=root, env=_env(root), capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == expect, f"{' '.join(map(str, args))} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def stage_name(address: str) -> str:
    """A stage's name without its dvc.yaml (a run stage's file is its shard's: workflow/dvc/runs/SHARD/dvc.yaml)."""
    return address.rsplit(":", 1)[-1]


def _project_copy(root: Path, params: dict, workflow: bool = False) -> Path:
    root.mkdir()
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy2(REPO / name, root / name)
    if not workflow:  # the run stages' dvc.yaml files (workflow/dvc/runs/SHARD)
        shutil.copytree(REPO / "workflow" / "dvc", root / "workflow" / "dvc")
    shutil.copytree(REPO / "src" / "noisymlt", root / "src" / "noisymlt", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if workflow:  # Snakemake's files: the root Snakefile, its default profile, workflow/ (rules, profiles, dvc/)
        shutil.copy2(REPO / "Snakefile", root / "Snakefile")
        shutil.copytree(REPO / "profiles", root / "profiles")
        shutil.copytree(REPO / "workflow", root / "workflow", symlinks=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _run([sys.executable, "-m", "noisymlt", "params", "params.yaml", "--out", "dvc-params.json"], root)  # DVC reads it
    _run([DVC, "init", "--no-scm", "--quiet"], root)
    return root


def _needs_tools() -> None:
    pytest.importorskip("noisymlt.pipeline.paths", reason="dvc.yaml needs `noisymlt step` (noisymlt/pipeline/paths.py)")
    if not DVC.exists():
        pytest.skip(f"dvc is not installed next to {sys.executable}")


# Written by a Snakemake job beside its declared outputs: Snakemake deletes a job's declared outputs before
# it runs and after it fails, which would lose the epochs an interrupted training resumes from.
UNDECLARED_BY_SNAKEMAKE = ("checkpoint.pt",)
# Written before either tool runs, by `noisymlt params` (the README's routes and `make demo-dvc` run it).
BEFORE_EITHER_ROUTE = ("dvc-params.json", "dvc-params-runs")


def unwritten_outputs(outs: set[str], smk: dict[str, str]) -> list[str]:
    """DVC outputs the Snakemake route does not write (`dvc commit` after `snakemake` would fail on them):
    not a file a Snakemake job declares, nor a folder holding some, nor a checkpoint of a train job, nor
    the params file both routes write first."""
    run_dirs = {Path(f).parent.as_posix() for f, rule in smk.items() if rule in ("train", "train_candidate")}

    def written(out: str) -> bool:
        if out in smk or any(f.startswith(out + "/") for f in smk) or out in BEFORE_EITHER_ROUTE:
            return True
        return Path(out).name in UNDECLARED_BY_SNAKEMAKE and Path(out).parent.as_posix() in run_dirs

    return sorted(o for o in outs if not written(o))


def dvc_outputs(root: Path) -> dict[str, list[str]]:
    """Stage -> declared outputs, as DVC expands dvc.yaml."""
    dump = ("import json; from dvc.repo import Repo\n"
            "print(json.dumps({s.addressing: [str(o.def_path) for o in s.outs] for s in Repo('.').index.stages}))")
    return json.loads(_run([sys.executable, "-c", dump], root).strip().splitlines()[-1])


def snakemake_outputs(root: Path, *args: str) -> dict[str, str]:
    """Every file the jobs of Snakemake's target (default: `rule all`) declare -> its rule (`--summary`)."""
    summary = _run([SNAKEMAKE, *args, "--summary", "--cores", "1"], root).splitlines()
    header = next(i for i, line in enumerate(summary) if line.startswith("output_file\t"))
    return {line.split("\t")[0]: line.split("\t")[2] for line in summary[header + 1:] if "\t" in line}


SNAKEMAKE_ONLY = ("reports/ablation_", "reports/inference_time_", "reports/noise_level_", "reports/pseudo_labels_",
                  "reports/readme_numbers.json", "reports/paired_")


def snakemake_only(path: str) -> bool:
    """Outputs dvc.yaml's header lists as Snakemake's alone: ablation tables and figures, the running-time
    table, the training-dynamics figures and the README's numbers."""
    return path.startswith(SNAKEMAKE_ONLY)


def test_every_step_is_one_declaration_that_its_rule_and_its_stage_read():
    """Agreement by construction, in place of a test comparing the two routes' plans: every declared step (but DVC's
    own bookkeeping) is read by a Snakemake rule, which takes its inputs, outputs and shell from it, and is a stage
    of the generated stage files; no rule spells a shell command of its own but Snakemake-only steps'."""
    from noisymlt.pipeline import dvc_yaml
    from noisymlt.pipeline.steps import STEPS

    rules = "".join(p.read_text() for p in sorted((REPO / "workflow" / "rules").glob("*.smk")))
    stages = {**yaml.safe_load(dvc_yaml.root_text())["stages"], **yaml.safe_load(dvc_yaml.shard_text("00"))["stages"]}
    assert [s.name for s in STEPS if not s.snakemake_only] == list(stages)
    for step in STEPS:
        if step.dvc_only:
            continue
        assert f'STEPS["{step.name}"].shell' in rules, step.name
        if step.name not in ("raw", "assets", "train_images"):  # DVC: the folder; Snakemake: a file in it (a rule per
            # kind of source: make_toy / download, fetch_asset per file, the fetched images' manifest)
            assert f'**STEPS["{step.name}"].outputs(' in rules, step.name
        if step.input:
            assert f'**STEPS["{step.name}"].input' in rules, step.name
    # no rule spells a shell of its own (the Snakemake-only steps are declared too, snakemake_only)
    assert re.findall(r"^    shell:\n        (?!STEPS\[)", rules, flags=re.M) == []
    # one rule per step, and the raw step's second (download beside make_toy; make_voc_toy is a `use rule`)
    assert rules.count("    shell:\n") == len([s for s in STEPS if not s.dvc_only]) + 1


def _tiny_params() -> dict:
    """A toy-only params.yaml (no voc/coco blocks, no download block) sized for a seconds-long run."""
    from noisymlt.config import deep_merge, load_params

    params = load_params(REPO / "params.yaml", REPO / "workflow" / "profiles" / "demo" / "params.yaml")
    toy = params["datasets"]["toy"]
    toy["toy"] = {"seed": 0, "n_trainval": 240, "n_test": 60, "size": 32}
    toy["longtail"] = {"source": "pareto", "b": 6, "max": 60, "min": 3, "seed": 0}
    params["datasets"] = {"toy": toy}
    for key in ("download", "ablations", "timing"):
        params.pop(key, None)
    params["grid"] = {"datasets": ["toy"], "gammas": [0.5], "seeds": [0], "methods": ["erm"]}
    params["methods"] = {"erm": params["methods"]["erm"]}
    params["train"] = deep_merge(params["train"], {
        "epochs": 1, "batch_size": 16, "image_size": 32, "workers": 0, "warmup_iters": 2, "lr_steps": [1],
        "eval_batch_size": 64, "weights_path": None})  # resnet_tiny from scratch: no pretrain job
    params.pop("pretrain", None)
    for name in ("db", "db_random"):  # a schedule's keys win over the train block
        params["schedules"][name]["train"].update(warmup_iters=2, epochs=1, lr_steps=[1])
    # model selection as the demo's (Ours: lr, then alpha x beta) on two values each; entries of absent methods go
    selection = params["selection"]
    selection["grids"] = {"lr": [0.02, 0.08], "alpha": [0.9, 0.7], "beta": [0.1]}
    selection["methods"] = {k: v for k, v in selection["methods"].items() if k in params["methods"] or "*" in k}
    return params


def _digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for top in ("data", "runs", "reports") for p in sorted((root / top).rglob("*"))
            if p.is_file() and p.name not in ("train_log.jsonl", ".train.lock")  # .dvcignored, not outputs
            and not p.name.endswith(".timing.json") and ".finished" not in p.parts
            and p.parent.name != "trunk"}  # DATASET/cache/trunk/: the trunk cache's memo (a local cache, not an output)


def test_readme_draws_the_demo_pipeline_as_dvc_dag_collapses_it(tmp_path):
    """The manual's pipeline drawing (docs/dvc.md) is DVC's collapsed graph of the demo's dvc.yaml (stage families,
    not runs), with Ours' model selection in the run as at paper scale (the layer select_ours.yaml)."""
    _needs_tools()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    root = _project_copy(tmp_path / "proj", params, workflow=True)
    _run([sys.executable, "-m", "noisymlt", "params", "params.yaml", "workflow/profiles/demo/params.yaml",
          "workflow/profiles/demo/select_ours.yaml", "--out", "dvc-params.json"], root)
    md = _run([DVC, "dag", "--collapse-foreach-matrix", "--md"], root)
    assert readme_dag(md) in (REPO / "docs" / "dvc.md").read_text()
    assert 15 < readme_dag(md).count("-->") < 60  # a drawing a reader can follow


def test_the_stage_files_are_what_the_step_declarations_give_and_a_hand_edit_is_caught(tmp_path):
    """dvc.yaml and workflow/dvc/runs/SHARD/dvc.yaml are written from the step declarations (noisymlt.pipeline.steps,
    `noisymlt dvc-yaml`): the committed ones are current; a hand edit of a generated file fails the check, and
    regenerating restores it."""
    from noisymlt.pipeline import dvc_yaml
    from noisymlt.pipeline.params import DVC_SHARDS

    assert dvc_yaml.stale(REPO) == []
    files = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "workflow" / "dvc" / "runs").glob("*/dvc.yaml"))
    assert files == [f"workflow/dvc/runs/{i:02d}/dvc.yaml" for i in range(DVC_SHARDS)]
    shard = yaml.safe_load((REPO / files[3]).read_text())
    assert shard["vars"] == ["../../../../dvc-params-runs/03.json:dvc_runs_03"]
    assert shard["stages"]["train"]["foreach"] == "${dvc_runs_03.runs}"
    assert shard["stages"]["train"]["do"]["wdir"] == "../../../.."  # paths stay the project root's
    assert shard["stages"]["train"]["do"]["cmd"].startswith("${dvc_runs_03.preload} python -m noisymlt step train ")
    structure = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["structure"]
    assert structure["do"]["cmd"] == (  # the command Snakemake's structure rule runs, in DVC's templating
        "${dvc.preload} python -m noisymlt structure --labels data/${item}/train_labels.parquet "
        "--split data/${item}/class_split.json --test-labels data/${item}/test_labels.parquet "
        "--out reports/structure_${item}.json --md reports/structure_${item}.md")

    for name in ("dvc.yaml", "workflow/dvc/runs/05/dvc.yaml"):
        copy = tmp_path / name.replace("/", "_")
        shutil.copytree(REPO / "workflow" / "dvc", copy / "workflow" / "dvc")
        shutil.copy2(REPO / "dvc.yaml", copy / "dvc.yaml")
        edited = copy / name
        edited.write_text(edited.read_text().replace(" --evaluate\n", " --evaluate --device cpu\n", 1)
                          .replace("--md ", "--md  ", 1))
        assert dvc_yaml.stale(copy) == [Path(name)]
        out = _run([sys.executable, "-m", "noisymlt", "dvc-yaml", "--check", "--root", copy], copy, expect=1)
        assert out.strip() == f"{name}: not what the step declarations (noisymlt/pipeline/steps.py) give; run `noisymlt dvc-yaml`"
        _run([sys.executable, "-m", "noisymlt", "dvc-yaml", "--root", copy], copy)
        assert dvc_yaml.stale(copy) == [] and edited.read_text() == (REPO / name).read_text()
    assert _run([sys.executable, "-m", "noisymlt", "dvc-yaml", "--where", "toy-0.5-0-erm"], tmp_path).strip() == \
        dvc_yaml.address("toy-0.5-0-erm")


@pytest.mark.slow
def test_an_argument_added_to_a_step_is_one_edit_that_both_routes_run(tmp_path):
    """The manual's promise (docs/dvc.md): a flag added to a step's declared command, in one place, is in the
    command Snakemake plans (`snakemake -n -p`) and in the one DVC plans (`dvc repro --dry`, after
    `noisymlt params`, the DVC route's first command, has rewritten the stage files)."""
    _needs_tools()
    if not SNAKEMAKE.exists():
        pytest.skip(f"snakemake is not installed next to {sys.executable}")
    root = _project_copy(tmp_path / "proj", yaml.safe_load((REPO / "params.yaml").read_text()), workflow=True)
    steps = root / "src" / "noisymlt" / "pipeline" / "steps.py"
    text = steps.read_text()
    declared = '"structure", "structure --labels {input.labels} --split {input.split} '
    assert text.count(declared) == 1
    steps.write_text(text.replace(declared, declared + "--flag-added-by-a-test "))
    words = "structure --labels data/voc/train_labels.parquet --split data/voc/class_split.json --flag-added-by-a-test "
    plan = _run([SNAKEMAKE, "-n", "-p", "--cores", "1", "--forceall", "reports/structure_voc.md"], root)
    assert words in plan
    written = _run([sys.executable, "-m", "noisymlt", "params", "params.yaml", "--out", "dvc-params.json"], root)
    assert "dvc.yaml: rewritten from the step declarations" in written
    dry = _run([DVC, "repro", "--dry", "--force", "--single-item", "structure@voc"], root)
    assert words in dry
    assert _run([sys.executable, "-m", "noisymlt", "dvc-yaml", "--check"], root) == ""
