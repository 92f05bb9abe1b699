"""The algorithms: one module each, holding its Strategy, its client and its options.

Importing this package imports every algorithm module in it, which registers each algorithm under
its config name
([`pflower.core.algorithm.register_algorithm`][pflower.core.algorithm.register_algorithm]): a new
algorithm is a new
module here and nothing else.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
