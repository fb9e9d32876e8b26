# A backbone pretrained on the synthetic source task (the demo's ImageNet), once; runs whose
# train.weights_path names it wait for it.


rule pretrain:
    output:
        weights="data/pretrained/{name}.pt",
        report="data/pretrained/{name}.json",
    params:
        cli=NOISYMLT,
        config=pretrain_config,
        code=code("pretrain"),
    threads: 2
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/pretrain/{name}.log",
    benchmark:
        "benchmarks/pretrain/{name}.tsv"
    shell:
        "{params.cli} pretrain --config {params.config:q} --out {output.weights} --no-progress > {log} 2>&1"


# One training run per (dataset, noise rate, seed, method). The job picks its own GPU
# (CUDA_VISIBLE_DEVICES under SLURM, else a per-GPU lock), so --resources gpu=N spreads jobs over N cards.


rule train:
    input:
        train="data/{dataset}/noisy/g{gamma}_s{seed}.parquet",
        test="data/{dataset}/test_labels.parquet",
        split="data/{dataset}/class_split.json",
        images=lambda w: train_images_ready(w.dataset),
        raw=lambda w: raw_marker(w.dataset),
        subset="data/{dataset}/train_labels.parquet",
        weights=backbone_weights,
        caches=run_caches,
    output:
        predictions="runs/{dataset}/g{gamma}/s{seed}/{method}/predictions.npz",
        manifest="runs/{dataset}/g{gamma}/s{seed}/{method}/manifest.json",
    params:
        cli=NOISYMLT,
        run_config=run_config,
        out=run_dir,
        train_images=lambda w: image_root(w.dataset, "train"),
        test_images=lambda w: image_root(w.dataset, "test"),
        caches=cache_args,
        code=run_code,
    threads: train_threads
    resources:
        gpu=1,
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/train/{dataset}_g{gamma}_s{seed}_{method}.log",
    benchmark:
        "benchmarks/train/{dataset}_g{gamma}_s{seed}_{method}.tsv"
    shell:
        "{params.cli} train --run-config {params.run_config:q} --train-labels {input.train} "
        "--test-labels {input.test} --split {input.split} --train-images {params.train_images} "
        "--test-images {params.test_images} {params.caches} --out {params.out} --cores {threads} --no-progress --keep-stale "
        "--provenance raw_manifest={input.raw} clean_subset={input.subset} > {log} 2>&1"
