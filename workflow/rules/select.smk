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
        **STEPS["select_split"].outputs(),
    params:
        args=lambda w: step_args("select_split", dataset=w.dataset),
        code=code("select"),
    log:
        "logs/select/split_{dataset}.log",
    shell:
        STEPS["select_split"].shell


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
        **STEPS["cache_select_images"].outputs(),
    wildcard_constraints:
        part="fit|val",
    params:
        args=lambda w: step_args("cache_select_images", dataset=w.dataset, part=w.part),
        code=code("cache-images"),
    log:
        "logs/data/cache_images_{dataset}_select_{part}.log",
    shell:
        STEPS["cache_select_images"].shell


# A candidate is an ordinary training run: on the fit part, its "test" set the validation part (train images),
# then evaluated against it, in one job as a final run (train.smk).
rule train_candidate:
    input:
        **STEPS["train_candidate"].input,
        images=lambda w: train_images_ready(w.dataset),
        files=run_files,
        caches=candidate_caches,
        previous=previous_choice,
    output:
        **STEPS["train_candidate"].outputs(),
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
        STEPS["train_candidate"].shell


checkpoint select:
    input:
        candidates=stage_candidates,
        previous=previous_choice,
    output:
        **STEPS["select"].outputs(),
    params:
        selection=lambda w: json.dumps(config["selection"], sort_keys=True),
        previous=lambda w, input: f"--previous {input.previous}" if input.previous else "",
        code=code("select"),
    localrule: True
    log:
        "logs/select/{dataset}_{method}_stage{stage}.log",
    shell:
        STEPS["select"].shell
