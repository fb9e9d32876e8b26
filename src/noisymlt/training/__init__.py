"""One training run: the Trainer and what it is made of.

The loop and the run's life (trainer), the optimizer, its parameter groups and lr schedule (schedule), checkpoints and
the run folder (checkpoint), a finished run's predictions and manifest (run_outputs), the images a run reads
(inputs, loaders, transforms, augment, trunkcache; the samplers and batch plans are noisymlt.data.sampling),
devices and precision (devices, numerics), the card a train job takes (cards: the train command's choice, before
the trainer starts), what is measured along the way (noise_monitor, fit_diagnostics) and the toy backbone's
pretraining (pretrain). What a method computes lives in noisymlt.methods, noisymlt.models and noisymlt.losses; the
`train` command that reads a run's resolved configuration is noisymlt.pipeline.train.
"""
