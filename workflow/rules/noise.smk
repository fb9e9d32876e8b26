# Clean long-tailed labels -> one noisy copy per (noise rate, seed), with realised-noise statistics.
# Its files and command are declared in noisymlt.pipeline.steps (STEPS, common.smk), as DVC's noise stage is.


rule noise:
    input:
        **STEPS["noise"].input,
    output:
        **STEPS["noise"].outputs(),
    params:
        code=code("noise"),
    log:
        "logs/noise/{dataset}_g{gamma}_s{seed}.log",
    benchmark:
        "benchmarks/noise/{dataset}_g{gamma}_s{seed}.tsv"
    shell:
        STEPS["noise"].shell
