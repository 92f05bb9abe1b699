"""Cross-run reports (``pflower report``): run loading, grouping by experiment, statistics over
seeds, tables and figures. The command line lives in :mod:`pflower.report`."""
