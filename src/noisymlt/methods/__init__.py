"""Method registry. Importing this package registers every method family."""

from noisymlt.methods.base import FAMILIES, Method, TrainContext, register_family
from noisymlt.methods import single  # noqa: F401  (registers "single")
from noisymlt.methods import colearning_family  # noqa: F401  (registers "colearning")
from noisymlt.methods import bbn, mlgcn  # noqa: F401  (register "bbn", "mlgcn")
from noisymlt.methods import dividemix  # noqa: F401  (registers "dividemix")

__all__ = ["FAMILIES", "Method", "TrainContext", "register_family"]
