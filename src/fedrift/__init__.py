"""fedrift: federated learning under client drift, every remedy under one fast engine."""

from fedrift._inductor_cache import separate
from fedrift._malloc import keep_freed_memory
from fedrift._omp import share_cores

share_cores()  # before torch is imported: concurrent fedrift processes must not spin on each other
keep_freed_memory()  # a step's freed activations are kept for the next, not faulted in again
separate()  # engine.compile's cache: a folder of its own under ATEN_CPU_CAPABILITY, before torch's compiler loads

from fedrift.api import RunResult, resume, run  # noqa: E402 - after share_cores()
from fedrift.experiments.compare import compare, write_report
from fedrift.experiments.select import select
from fedrift.experiments.tune import tune
from fedrift.config import Config, load_config
from fedrift.errors import ConfigError, DataError, DivergenceError, FedriftError

from fedrift.version import __version__  # noqa: E402
__all__ = ["Config", "ConfigError", "DataError", "DivergenceError", "FedriftError", "RunResult", "compare", "load_config",
           "resume", "run", "select", "tune",
           "write_report", "__version__"]
