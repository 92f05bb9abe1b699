"""The algorithms: one module each, holding its Strategy, its client and its options.

Importing this package imports every algorithm module in it, which registers each algorithm under
its config name ([`pflower.api.register_algorithm`][pflower.api.register_algorithm]): a new
algorithm is a new module here and nothing else. It then loads the plugins
([`pflower.plugins.load_plugins`][pflower.plugins.load_plugins]): the user's own algorithms,
datasets, models and partitioners, registered through [`pflower.api`][pflower.api] from outside the
repository. Every process that composes or runs a configuration imports this package, so every such
process knows the same algorithms.
"""

import importlib
import pkgutil

from pflower.plugins import load_plugins

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

load_plugins()
