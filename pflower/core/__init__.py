"""The shared machinery every algorithm builds on, side by side:

- :mod:`.strategy`: :class:`~.strategy.PersonalizedStrategy`, the server half;
- :mod:`.client`: :class:`~.client.PersonalClient`, the client half;
- :mod:`.options`: :class:`~.options.AlgorithmOptions`, the config schema of an algorithm;
- :mod:`.algorithm`: the registry that ties the three together under a config name;
- :mod:`.aggregation`: the weighted averages of client models;
- :mod:`.store`: the server's per-client model store (server-personalized algorithms);
- :mod:`.nodes`: questions to nodes that never block the server; simulation node counts;
- :mod:`.state`: typed access to a client's memory across rounds (``context.state``);
- :mod:`.training`: the local training and evaluation loops;
- :mod:`.packing`: a message's arrays as one array, for a deployment to move;
- :mod:`.experiment`: the federation, models and settings both sides derive from the config.
"""
