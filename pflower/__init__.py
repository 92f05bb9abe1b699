"""pflower: personalized federated learning on Flower.

Importing pflower turns Flower's usage telemetry off, for this process and the processes it
starts, unless ``FLWR_TELEMETRY_ENABLED`` is already set: set it to ``1`` to send it. It also
fingerprints pflower's source files ([`pflower.provenance`][pflower.provenance]), so the
fingerprint names the code the process started with, and holds torch's CPU kernels to AVX2
unless ``PFLOWER_NUMERICS`` says ``native``
([`hold_kernels`][pflower.provenance.hold_kernels]; the config key ``numerics``), so that every
process of a run (CLI, workers, Ray actors, SuperNodes, tuning trials) computes alike.
"""

import os

from pflower import provenance

provenance.hold_kernels(os.environ.get(provenance.NUMERICS_ENV, provenance.HELD))

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
