# Clean long-tailed labels -> one noisy copy per (noise rate, seed), with realised-noise statistics.


rule noise:
    input:
        "data/{dataset}/train_labels.parquet",
    output:
        labels="data/{dataset}/noisy/g{gamma}_s{seed}.parquet",
        stats="data/{dataset}/noisy/g{gamma}_s{seed}.json",
    params:
        code=code("noise"),
    log:
        "logs/noise/{dataset}_g{gamma}_s{seed}.log",
    benchmark:
        "benchmarks/noise/{dataset}_g{gamma}_s{seed}.tsv"
    shell:
        "$NOISYMLT_CLI noise --labels {input} --gamma {wildcards.gamma} --seed {wildcards.seed} "
        "--out {output.labels} --stats {output.stats} > {log} 2>&1"
