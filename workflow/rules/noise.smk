# Clean long-tailed labels -> one noisy copy per (noise model, noise rate, seed), with realised-noise statistics.
# Its files and command are declared in noisymlt.pipeline.steps (STEPS, common.smk), as DVC's noise stage is. The
# paper's model writes g{gamma}_s{seed}; another model's name follows the rate (g0.5-uniform_s0).


rule noise:
    input:
        **STEPS["noise"].input,
        model_file=lambda w: paths.noise_file(config, w.dataset, layout.noise_name(w.noise)),
    output:
        **STEPS["noise"].outputs(),
    params:
        args=lambda w: step_args("noise", dataset=w.dataset, gamma=w.gamma, seed=w.seed, noise=w.noise),
        code=code("noise"),
    log:
        "logs/noise/{dataset}_g{gamma}{noise}_s{seed}.log",
    benchmark:
        "benchmarks/noise/{dataset}_g{gamma}{noise}_s{seed}.tsv"
    shell:
        STEPS["noise"].shell
