"""Class-conditional noise: replacements drawn from a transition matrix the user gives.

Each clean positive i is kept with probability 1 - gamma; otherwise it is replaced by class j with probability
M[i, j], M the row-stochastic C x C matrix of the file ``noise.class_conditional.matrix``, so the label moves as
T = (1 - gamma) I + gamma M. M's diagonal is a chance to stay: gamma 1 with a full matrix T as M applies T as it
is. The noise of loss-correction methods (Natarajan et al., NeurIPS 2013; Patrini et al., CVPR 2017), per positive
label.
"""

from __future__ import annotations

import numpy as np

from noisymlt.data.noise_models.base import NoiseModel, read_matrix, register_noise_model, replaced_by_rows
from noisymlt.errors import NoisyMLTError


@register_noise_model("class_conditional")
class ClassConditional(NoiseModel):
    label = "class-conditional"
    options = {"matrix": {"type": "string", "minLength": 1,
                          "description": "C x C row-stochastic matrix: a CSV (header and first column: the class "
                                         "names in the dataset's order) or a .npy array"}}

    def prepare(self, options, classes, source):
        if not options.get("matrix"):
            raise NoisyMLTError(f"{source}: noise model class_conditional needs noise.class_conditional.matrix (a file)")
        return read_matrix(options["matrix"], classes, f"{source}: noise.class_conditional.matrix")

    def files(self, options, dataset, gamma):
        return [options["matrix"]] if options.get("matrix") else []

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        return replaced_by_rows(_matrix(prepared), cols, gamma, rng)

    def transition(self, clean, gamma, prepared):
        M = _matrix(prepared)
        C = M.shape[0]
        T = np.zeros((C, C + 1))
        T[:, :C] = gamma * M + (1.0 - gamma) * np.eye(C)
        return T


def _matrix(prepared: np.ndarray | None) -> np.ndarray:
    """The matrix ``prepare`` read; a caller that skipped it gets told so."""
    if prepared is None:
        raise NoisyMLTError("noise model class_conditional: no matrix (prepare it from noise.class_conditional)")
    return prepared
