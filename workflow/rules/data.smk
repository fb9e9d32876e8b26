# Raw data -> label tables -> long-tailed training subset and class split.


rule make_toy:
    output:
        "data/raw/toy/VOCdevkit/TOY/toy_manifest.json",
    params:
        cli=NOISYMLT,
        args=lambda w: " ".join(
            f"--{k.replace('_', '-')} {v}"
            for k, v in next(d for d in config["datasets"].values() if d["kind"] == "toy")["toy"].items()
        ),
        code=CODE,
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/data/make_toy.log",
    benchmark:
        "benchmarks/data/make_toy.tsv"
    shell:
        "{params.cli} make-toy --out data/raw/toy {params.args} > {log} 2>&1"


rule download:
    output:
        "data/raw/{kind}/manifest.json",
    wildcard_constraints:
        kind="voc|coco",
    params:
        cli=NOISYMLT,
        mirror=lambda w: f"--mirror {config['download']['mirror']}" if config.get("download", {}).get("mirror") else "",
        retries=config.get("download", {}).get("retries", 5),
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/data/download_{kind}.log",
    benchmark:
        "benchmarks/data/download_{kind}.tsv"
    shell:
        "{params.cli} download --dataset {wildcards.kind} --root data/raw/{wildcards.kind} "
        "{params.mirror} --retries {params.retries} > {log} 2>&1"


rule parse_labels:
    input:
        lambda w: raw_marker(w.dataset),
    output:
        "data/{dataset}/{part}_labels.parquet",
    wildcard_constraints:
        part="train_source|test",
    params:
        cli=NOISYMLT,
        args=lambda w: parse_args(w.dataset, "train" if w.part == "train_source" else "test"),
        code=CODE,
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/data/parse_{dataset}_{part}.log",
    benchmark:
        "benchmarks/data/parse_{dataset}_{part}.tsv"
    shell:
        "{params.cli} parse {params.args} --out {output} > {log} 2>&1"


rule longtail:
    input:
        "data/{dataset}/train_source_labels.parquet",
    output:
        labels="data/{dataset}/train_labels.parquet",
        split="data/{dataset}/class_split.json",
    params:
        cli=NOISYMLT,
        args=lambda w: (
            lambda lt: f"--source {lt['source']} --b {lt.get('b', 6)} "
            f"--max {lt.get('max', 800)} --min {lt.get('min', 1)} --seed {lt.get('seed', 0)}"
            + (" --cap-to-available" if lt.get("cap_to_available") else "")
            + (f" --dataset {kind(w.dataset)}" if lt["source"] == "official" else "")
        )(config["datasets"][w.dataset]["longtail"]),
        code=CODE,
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/data/longtail_{dataset}.log",
    benchmark:
        "benchmarks/data/longtail_{dataset}.tsv"
    shell:
        "{params.cli} longtail --labels {input} --out {output.labels} --split-out {output.split} "
        "{params.args} > {log} 2>&1"


rule fetch_coco_train_images:
    input:
        labels="data/{dataset}/train_labels.parquet",
        raw=lambda w: raw_marker(w.dataset),
    output:
        touch("data/{dataset}/train_images.done"),
    params:
        cli=NOISYMLT,
        mirror=lambda w: f"--mirror {config['download']['mirror']}" if config.get("download", {}).get("mirror") else "",
        raw=lambda w: raw_dir(w.dataset),
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/data/fetch_images_{dataset}.log",
    benchmark:
        "benchmarks/data/fetch_images_{dataset}.tsv"
    shell:
        "{params.cli} fetch-coco-images --annotations {params.raw}/annotations/instances_train2017.json "
        "--ids {input.labels} --out {params.raw}/train2017 {params.mirror} > {log} 2>&1"
