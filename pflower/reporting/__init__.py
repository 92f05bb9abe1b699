"""Cross-run reports (``pflower report``): grouping runs into experiments, statistics over seeds,
tables and figures. The command line is [`pflower.reporting.report`][pflower.reporting.report]; runs
are read with
[`pflower.results.runs.load_runs`][pflower.results.runs.load_runs]."""
