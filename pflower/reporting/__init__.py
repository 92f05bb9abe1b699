"""Cross-run reports (``pflower report``): grouping runs into experiments, statistics over seeds,
tables and figures. The command line is :mod:`pflower.reporting.report`; runs are read with
:func:`pflower.results.runs.load_runs`."""
