"""pflower: personalized federated learning on Flower.

Importing pflower turns Flower's usage telemetry off, for this process and the processes it
starts, unless ``FLWR_TELEMETRY_ENABLED`` is already set: set it to ``1`` to send it. It also
fingerprints pflower's source files ([`pflower.provenance`][pflower.provenance]), so the fingerprint
names the code
the process started with.
"""

import os

from pflower import provenance  # noqa: F401

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
