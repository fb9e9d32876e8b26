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


# The held-out images, one draw a dataset over the selection sets' noisy tables (NAME=TABLE each).


rule select_split:
    input:
        lambda w: list(S.split_tables(config, w.dataset).values()),
    output:
        split=layout.SELECT_SPLIT,
    params:
        noisy=lambda w: [f"{name}={table}" for name, table in S.split_tables(config, w.dataset).items()],
        held_out=lambda w: config["selection"]["held_out"],
        seed=lambda w: config["selection"]["split_seed"],
        code=code("select"),
    log:
        "logs/select/split_{dataset}.log",
    shell:
        "$NOISYMLT_CLI select split --noisy {params.noisy:q} --held-out {params.held_out} --seed {params.seed} "
        "--out {output.split} > {log} 2>&1"


rule select_parts:
    input:
        noisy=layout.with_noise(layout.NOISY, PAPER),
        split=layout.SELECT_SPLIT,
    output:
        fit=layout.part(layout.SELECT_PART, "fit"),
        val=layout.part(layout.SELECT_PART, "val"),
    params:
        code=code("select"),
    log:
        "logs/select/parts_{dataset}_g{gamma}_s{seed}.log",
    shell:
        "$NOISYMLT_CLI select parts --noisy {input.noisy} --split {input.split} --fit {output.fit} --val {output.val} "
        "> {log} 2>&1"


# The fit / val images decoded once (train.loader: cache), from the first selection set's table of the part, at the
# dataset's train.cache_size.


rule cache_select_images:
    input:
        labels=select_cache_labels,
        images=lambda w: train_images_ready(w.dataset),
    output:
        array=layout.SELECT_CACHE,
        index=layout.SELECT_CACHE_INDEX,
        manifest=layout.SELECT_CACHE_MANIFEST,
    wildcard_constraints:
        part="fit|val",
    params:
        images=lambda w: image_root(w.dataset, "train"),
        size=lambda w: paths.cache_size(config, w.dataset),
        code=code("cache-images"),
    log:
        "logs/data/cache_images_{dataset}_select_{part}.log",
    shell:
        "$NOISYMLT_CLI cache-images --labels {input.labels} --images {params.images:q} --size {params.size} "
        "--out {output.array} --no-progress > {log} 2>&1"


# A candidate is an ordinary training run: on the fit part, its "test" set the validation part (train images),
# then evaluated against it, in one job as a final run (train.smk).


rule train_candidate:
    input:
        train=layout.part(layout.SELECT_PART, "fit"),
        val=layout.part(layout.SELECT_PART, "val"),
        split=layout.CLASS_SPLIT,
        images=lambda w: train_images_ready(w.dataset),
        files=run_files,
        caches=lambda w: candidate_cache_args(w)[1::2],
        previous=previous_choice,
    output:
        **run_outputs(layout.CANDIDATE, noise_log=False),
    params:
        out=lambda w: S.candidate_dir(w.dataset, w.method, int(w.stage), float(w.gamma), int(w.seed), w.tag),
        images=lambda w: image_root(w.dataset, "train"),
        caches=lambda w: argv(candidate_cache_args(w)),
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
        "--out {params.out} --no-progress --keep-stale --expect-code {params.code} "
        "--cores {threads} --runs-per-gpu {resources.runs_per_gpu} > {log} 2>&1 && "
        "$NOISYMLT_CLI evaluate --predictions {output.predictions} --test-labels {input.val} --split {input.split} "
        "--out {output.metrics} --map-out {output.map} >> {log} 2>&1"


# `noisymlt select choose`: every candidate's score and the values chosen so far (a local rule: a second's work).


checkpoint select:
    input:
        candidates=stage_candidates,
        previous=previous_choice,
    output:
        stage=layout.STAGE_FILE,
        choice=layout.CHOICE_FILE,
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
