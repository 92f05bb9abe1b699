"""Why a run stops on the server side: the errors the strategy and its collaborators raise."""

from __future__ import annotations


class RoundFailedError(RuntimeError):
    """Too many clients of a round failed: the run stops rather than continue on too little."""


class NodesMissingError(RoundFailedError):
    """The run cannot start: fewer nodes than ``num_clients`` connected within
    ``connect_timeout``, or a simulation's federation has another number of SuperNodes."""


class ResultsNotWrittenError(RuntimeError):
    """A write of the run's results failed (no space, a file-size limit, permissions): the run
    stopped, recorded as failed in its ``summary.json`` as far as the disk allowed."""
