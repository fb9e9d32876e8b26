"""[CL]'s published noisy labels, read in place of a draw (noisymlt.data.authors_noise, ``noisymlt authors-noise``).

The authors of the paper publish the noisy labels their runs trained on (``appendix.tar.gz``: one
``class_freq_<rate>noise.pkl`` per noise rate beside the subset's id list), not the code that drew them. Settings,
per dataset: the unpacked folder, the id list's name in it and the sha256 of each rate's file, checked before the
file is read. They drew one copy per rate, so every seed of a rate reads the same rows (the seeds vary training).
"""

from __future__ import annotations

from noisymlt.data.noise_models.base import NoiseModel, missing_file, register_noise_model
from noisymlt.errors import NoisyMLTError

FILE = "class_freq_{gamma}noise.pkl"  # [CL]'s name of a rate's file (mlltn configs: ann_file)
SHA256 = {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"}
DATASET_BLOCK = {
    "type": "object", "additionalProperties": False, "required": ["directory", "ids", "sha256"],
    "properties": {
        "directory": {"type": "string", "minLength": 1,
                   "description": "the unpacked folder holding class_freq_<rate>noise.pkl and the id list"},
        "ids": {"type": "string", "minLength": 1, "description": "the id list's name in it: img_id.txt, img_id.pkl"},
        "sha256": {"type": "object", "additionalProperties": SHA256, "minProperties": 1,
                   "description": "noise rate as the file names it ('0.5') -> the file's sha256"},
    },
}


def rate_text(gamma: float | str) -> str:
    """A noise rate as [CL]'s file names write it (0.5 -> '0.5')."""
    return str(float(gamma))


@register_noise_model("authors")
class Authors(NoiseModel):
    label = "[CL]'s published labels"
    command = "authors-noise"

    def schema(self):
        return {"type": "object", "additionalProperties": DATASET_BLOCK,
                "description": "dataset name -> where [CL]'s files for it are"}

    def block(self, options: dict, dataset: str) -> dict:
        if dataset not in options:
            raise NoisyMLTError(f"noise.authors.{dataset}: no block for dataset {dataset!r} (the folder of [CL]'s "
                                "files, the id list, each rate's sha256; docs/noise-models.md)")
        return options[dataset]

    def problems(self, options, datasets, gammas, root=None):
        found = []
        for dataset in datasets:
            if dataset not in options:
                found.append((dataset, f"grid.noise_models lists authors: say where [CL]'s files for {dataset} are"))
                continue
            block = options[dataset]
            found += [(f"{dataset}.sha256", f"no sha256 for noise rate {rate_text(g)} ({FILE.format(gamma=rate_text(g))})")
                      for g in gammas if rate_text(g) not in block["sha256"]]
            found += [(dataset, problem) for g in gammas if rate_text(g) in block["sha256"]
                      for f in self.files(options, dataset, g) if (problem := missing_file(f, root))]
        return found

    def files(self, options, dataset, gamma):
        block = self.block(options, dataset)
        folder = block["directory"]
        return [f"{folder}/{FILE.format(gamma=rate_text(gamma))}", f"{folder}/{block['ids']}"]

    def argv(self, options, dataset, gamma, seed, labels, out, stats):
        block = self.block(options, dataset)
        pickle, ids = self.files(options, dataset, gamma)
        return [self.command, "--pickle", pickle, "--sha256", block["sha256"][rate_text(gamma)],
                "--clean-labels", labels, "--ids", ids, "--out", out, "--stats", stats, "--gamma", rate_text(gamma)]

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        raise NoisyMLTError("noise model authors reads [CL]'s files (noisymlt authors-noise); it draws nothing")

    def transition(self, clean, gamma, prepared):
        raise NoisyMLTError("noise model authors: [CL]'s files hold the noisy outcome, not a transition matrix")
