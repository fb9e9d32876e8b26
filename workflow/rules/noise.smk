# Clean long-tailed labels -> one noisy copy per (noise model, noise rate, seed), with realised-noise statistics.
# Its files and command are declared in noisymlt.pipeline.steps (STEPS, common.smk), as DVC's noise stage is. The
# paper's model writes g{gamma}_s{seed}; another model's name follows the rate (g0.5-uniform_s0). The words come
# from the model (noisymlt.data.noise_models): `noise` draws, [CL]'s published labels are read (`authors-noise`).


rule noise:
    input:
        **STEPS["noise"].input,
        model_files=lambda w: paths.noise_files(config, w.dataset, float(w.gamma), layout.noise_name(w.noise)),
    output:
        **STEPS["noise"].outputs(),
    params:
        args=lambda w: step_args("noise", **noise_words(w)),
        code=lambda w: step_code.noise_digest(layout.noise_name(w.noise)),  # its command's and its model's code
    log:
        "logs/noise/{dataset}_g{gamma}{noise}_s{seed}.log",
    benchmark:
        "benchmarks/noise/{dataset}_g{gamma}{noise}_s{seed}.tsv"
    shell:
        STEPS["noise"].shell
