"""The models' named choices, torch-free: params validation (noisymlt.methods.options) checks a method
block against them without importing a model, and the models refuse anything else."""

BBN_SPLITS = ("stage", "block")  # where BBN's two branches part: before ResNet's last stage, or its last block
ADJACENCIES = ("code", "paper")  # ML-GCN's re-weighted adjacency: as its code builds it, or as its paper writes it
POOLINGS = ("max", "avg")  # ML-GCN's global pooling of the trunk's feature map
