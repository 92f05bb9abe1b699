"""The Flower ClientApp (:mod:`pflower.client.app`). The client half every algorithm derives from
is :class:`pflower.core.client.PersonalClient`."""
