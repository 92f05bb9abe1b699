"""The shared machinery every algorithm builds on, side by side:

- [`.strategy`][pflower.core.strategy]:
  [`PersonalizedStrategy`][pflower.core.strategy.PersonalizedStrategy], the server half;
- [`.client`][pflower.core.client]: [`PersonalClient`][pflower.core.client.PersonalClient], the
  client half;
- [`.options`][pflower.core.options]: [`AlgorithmOptions`][pflower.core.options.AlgorithmOptions],
  the config schema of an algorithm;
- [`.algorithm`][pflower.core.algorithm]: the registry that ties the three together under a config
  name;
- [`.aggregation`][pflower.core.aggregation]: the weighted averages of client models;
- [`.store`][pflower.core.store]: the server's per-client model store (server-personalized
  algorithms);
- [`.nodes`][pflower.core.nodes]: questions to nodes that never block the server; simulation node
  counts;
- [`.state`][pflower.core.state]: typed access to a client's memory across rounds
  (``context.state``);
- [`.training`][pflower.core.training]: the local training and evaluation loops;
- [`.experiment`][pflower.core.experiment]: the federation, models and settings both sides derive
  from the config.
"""
