# Run metrics -> results.parquet (long format, with provenance) -> paper-layout tables and figures.


rule aggregate:
    input:
        all_runs("runs/{dataset}/g{gamma}/s{seed}/{method}/metrics.json"),
    output:
        "reports/results.parquet",
    params:
        cli=NOISYMLT,
        code=code("aggregate"),
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/report/aggregate.log",
    benchmark:
        "benchmarks/report/aggregate.tsv"
    shell:
        "{params.cli} aggregate {input} --out {output} > {log} 2>&1"


rule table_total:
    input:
        "reports/results.parquet",
    output:
        tex="reports/table_total.tex",
        md="reports/table_total.md",
        cells="reports/table_total.cells.json",
    params:
        cli=NOISYMLT,
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        code=code("table"),
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/report/table_total.log",
    benchmark:
        "benchmarks/report/table_total.tsv"
    shell:
        "{params.cli} table --results {input} --out {output.tex} --labels {params.labels:q} --methods {params.methods} > {log} 2>&1"


rule figure_map_vs_gamma:
    input:
        "reports/results.parquet",
    output:
        "reports/map_vs_gamma.png",
    params:
        cli=NOISYMLT,
        code=code("figure"),
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/report/map_vs_gamma.log",
    benchmark:
        "benchmarks/report/map_vs_gamma.tsv"
    shell:
        "{params.cli} figure --results {input} --out {output} > {log} 2>&1"


rule table_ablation:
    input:
        "reports/results.parquet",
    output:
        tex="reports/ablation_{name}.tex",
        md="reports/ablation_{name}.md",
        cells="reports/ablation_{name}.cells.json",
    params:
        cli=NOISYMLT,
        labels=method_labels(),
        spec=lambda w: json.dumps(config["ablations"][w.name]),
        code=code("table"),
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/report/ablation_{name}.log",
    benchmark:
        "benchmarks/report/ablation_{name}.tsv"
    shell:
        "{params.cli} table --results {input} --out {output.tex} --ablation-spec {params.spec:q} "
        "--labels {params.labels:q} > {log} 2>&1"
