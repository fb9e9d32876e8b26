"""Method registry. Importing this package registers every method family."""

from noisymlt.methods.base import FAMILIES, Method, TrainContext, register_family
from noisymlt.methods import single  # noqa: F401  (registers "single")

__all__ = ["FAMILIES", "Method", "TrainContext", "register_family"]
