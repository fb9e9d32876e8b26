# Model selection (params `selection`, noisymlt.pipeline.selection): a held-out share of the training images, candidate
# runs on the rest scored against the held-out *noisy* labels, one choice per dataset, method and stage. Nothing
# here reads the test set or a clean label: the parts hold noisy labels only and the candidates' "test" set is
# the validation part.
# `select` is a checkpoint: the runs that read a choice (later stages' candidates, the final runs) take it into
# their resolved config once it exists, through their params (a changed choice is a changed config, which reruns
# exactly them); the choice file itself is an ancient input, so a selection that is redone and chooses the same
# values reruns nothing downstream.


wildcard_constraints:
    stage="[0-9]+",
    tag="[a-z0-9._]+",


rule select_split:
    input:
        lambda w: list(S.split_tables(config, w.dataset).values()),
    output:
        "data/{dataset}/select/split.json",
    params:
        args=lambda w, output: argv(paths.select_split_argv(config, w.dataset, output[0])),
        code=code("select"),
    log:
        "logs/select/split_{dataset}.log",
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"


rule select_parts:
    input:
        **STEPS["select_parts"].input,
    output:
        **STEPS["select_parts"].outputs(),
    params:
        code=code("select"),
    log:
        "logs/select/parts_{dataset}_g{gamma}_s{seed}.log",
    shell:
        STEPS["select_parts"].shell


rule cache_select_images:
    input:
        labels=lambda w: paths.select_cache_argv(config, w.dataset, w.part, "")[2],
        images=lambda w: train_images_ready(w.dataset),
    output:
        array="data/{dataset}/cache/select_{part}.npy",
        index="data/{dataset}/cache/select_{part}.json",
        manifest="data/{dataset}/cache/select_{part}.manifest.json",
    wildcard_constraints:
        part="fit|val",
    params:
        args=lambda w, output: argv(paths.select_cache_argv(config, w.dataset, w.part, output.array)),
        code=code("cache-images"),
    log:
        "logs/data/cache_images_{dataset}_select_{part}.log",
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"


CANDIDATE = "runs/{dataset}/select/{method}/stage{stage}/g{gamma}/s{seed}/{tag}"


# A candidate is an ordinary training run: on the fit part, its "test" set the validation part (train images),
# then evaluated against it, in one job as a final run (train.smk).
rule train_candidate:
    input:
        train="data/{dataset}/select/g{gamma}_s{seed}_fit.parquet",
        val="data/{dataset}/select/g{gamma}_s{seed}_val.parquet",
        split="data/{dataset}/class_split.json",
        images=lambda w: train_images_ready(w.dataset),
        files=run_files,
        caches=candidate_caches,
        previous=previous_choice,
    output:
        requested=f"{CANDIDATE}/requested_config.json",
        predictions=f"{CANDIDATE}/predictions.npz",
        manifest=f"{CANDIDATE}/manifest.json",
        config=f"{CANDIDATE}/run_config.json",
        metrics=f"{CANDIDATE}/metrics.json",
        map=f"{CANDIDATE}/map.json",  # validation mAP per head and group: DVC's metrics file
        evaluation=f"{CANDIDATE}/metrics.manifest.json",
    params:
        out=lambda w: S.candidate_dir(w.dataset, w.method, int(w.stage), float(w.gamma), int(w.seed), w.tag),
        images=lambda w: image_root(w.dataset, "train"),
        caches=candidate_cache_args,
        config=candidate_config,
        code=run_code,
        evaluate_code=code("evaluate"),
    threads: train_threads
    resources:
        gpu=1,
        runs_per_gpu=1,  # a packing profile raises it (and the gpu total) with set-resources
    log:
        "logs/select/{dataset}_{method}_stage{stage}_g{gamma}_s{seed}_{tag}.log",
    benchmark:
        "benchmarks/select/{dataset}_{method}_stage{stage}_g{gamma}_s{seed}_{tag}.tsv"
    shell:
        "printf '%s\\n' {params.config:q} > {output.requested} && "
        "$NOISYMLT_CLI train --run-config {output.requested} --train-labels {input.train} --test-labels {input.val} "
        "--split {input.split} --train-images {params.images} --test-images {params.images} {params.caches} "
        "--out {params.out} --cores {threads} --runs-per-gpu {resources.runs_per_gpu} --no-progress --keep-stale --expect-code {params.code} > {log} 2>&1 && "
        "$NOISYMLT_CLI evaluate --predictions {output.predictions} --test-labels {input.val} --split {input.split} "
        "--out {output.metrics} --map-out {output.map} >> {log} 2>&1"


checkpoint select:
    input:
        candidates=stage_candidates,
        previous=previous_choice,
    output:
        stage="runs/{dataset}/select/{method}/stage{stage}.json",
        choice="runs/{dataset}/select/{method}/stage{stage}.choice.json",
    params:
        selection=lambda w: json.dumps(config["selection"], sort_keys=True),
        previous=lambda w, input: f"--previous {input.previous}" if input.previous else "",
        code=code("select"),
    localrule: True
    log:
        "logs/select/{dataset}_{method}_stage{stage}.log",
    shell:
        "$NOISYMLT_CLI select choose --selection {params.selection:q} --dataset {wildcards.dataset} "
        "--method {wildcards.method} --stage {wildcards.stage} {params.previous} > {log} 2>&1"

