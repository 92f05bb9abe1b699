"""The Flower ServerApp (:mod:`pflower.server.app`). The server half every algorithm derives from
is :class:`pflower.core.strategy.PersonalizedStrategy`."""
