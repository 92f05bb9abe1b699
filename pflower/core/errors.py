"""Why a run stops on the server side: the errors the strategy and its collaborators raise."""

from __future__ import annotations


class RoundFailedError(RuntimeError):
    """Too many clients of a round failed: the run stops rather than continue on too little."""


class NodesMissingError(RoundFailedError):
    """The run cannot start: fewer nodes than ``num_clients`` connected within
    ``connect_timeout``, or a simulation's federation has another number of SuperNodes."""
