"""The module moves of issue 12 (old dotted name -> new dotted name), used once by the refactor and kept as
the source of the deprecation table (src/fastflip/_moved.py is generated from the same list)."""
MOVES = {
    # core: the fault-model primitives, no file or framework I/O
    "dtypes": "core.dtypes", "floatformats": "core.floatformats", "bits": "core.bits", "faults": "core.faults",
    "sampling": "core.sampling", "plan": "core.plan", "wordrule": "core.wordrule", "reference": "core.reference",
    "permutation": "core.permutation", "configcheck": "core.configcheck",
    # kernels
    "native": "kernels.dispatch", "kernels_numba": "kernels.numba_cpu", "kernels_cupy": "kernels.gpu",
    "environment": "kernels.environment", "_kernels": "kernels._cython",
    # files
    "layout": "files.layout", "roles": "files.roles", "select": "files.select", "h5target": "files.h5apply",
    "h5chunks": "files.h5chunks", "patches": "files.patches", "fileio": "files.fileio", "inject": "files.inject",
    "log": "files.log", "logcheck": "files.logcheck", "diff": "files.diff", "paths": "files.paths",
    "locks": "files.locks", "keras_io": "files.keras_archive", "formats": "files.formats",
    # frameworks
    "torch": "frameworks.torch_state", "convert": "frameworks.convert", "trainers": "frameworks.trainers",
    # experiment
    "experiment": "experiment.runner", "experiment_config": "experiment.config",
    "experiment_outcomes": "experiment.outcomes",
    # campaign
    "store": "campaign.store", "store_guard": "campaign.store_guard", "stats": "campaign.stats",
    "significance": "campaign.significance", "outcomes": "campaign.outcomes",
    # compat
    "oldconfig": "compat.oldconfig",
}
