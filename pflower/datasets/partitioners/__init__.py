"""Partition schemes by config name: how a pool of labelled samples is shared among clients.

A ``partition`` block ([`pflower.blocks`][pflower.blocks]) is ``{name: <scheme>, <option>: <value>,
...}``; the
client count and the seed come from the run (``num_clients``, ``seed``). Every scheme is a Flower
Datasets `Partitioner` (see [`.base`][pflower.datasets.partitioners.base]), registered in
[`PARTITIONERS`][pflower.datasets.partitioners.PARTITIONERS]. Modules by family:

- [`.uniform`][pflower.datasets.partitioners.uniform] — ``iid``, ``stratified_iid``
- [`.label_skew`][pflower.datasets.partitioners.label_skew] — ``pathological``, ``shards``,
  ``dirichlet``, ``ls``, ``class_groups``,
  ``q_label_skew``, ``dir_label_skew``, ``pflib_pathological``, ``pflib_practical``
- [`.quantity_skew`][pflower.datasets.partitioners.quantity_skew] — ``qs``, ``lsqs``,
  ``dir_quantity_skew``, ``hybrid_skew``
- [`.feature_skew`][pflower.datasets.partitioners.feature_skew] — ``quality_skew``,
  ``feature_skew``, ``attribute_groups``
- [`.from_file`][pflower.datasets.partitioners.from_file] — ``from_file`` (per-client index lists
  from a file; PFLlib import)
- [`.fixed_size`][pflower.datasets.partitioners.fixed_size] — ``diversifed_pathological``,
  ``diversifed_dirichlet``,
  ``diversifed_practical`` (these also draw the clients' test shares)

Shared machinery: [`.allocation`][pflower.datasets.partitioners.allocation] (whole-sample rounding,
count-matrix schemes) and
[`.sinkhorn`][pflower.datasets.partitioners.sinkhorn].
"""

from pflower.datasets.partitioners import (  # noqa: F401  (importing registers the schemes)
    feature_skew,
    fixed_size,
    from_file,
    label_skew,
    quantity_skew,
    uniform,
)
from pflower.datasets.partitioners.base import (
    PARTITIONERS,
    IndexPartitioner,
    InputNoiseScheme,
    Partition,
    SampleSharingScheme,
    TestAwarePartitioner,
    build_partitioner,
    partition_labels,
    shares_samples,
    to_hf_dataset,
)

__all__ = [
    "PARTITIONERS",
    "IndexPartitioner",
    "InputNoiseScheme",
    "Partition",
    "SampleSharingScheme",
    "TestAwarePartitioner",
    "build_partitioner",
    "partition_labels",
    "shares_samples",
    "to_hf_dataset",
]
