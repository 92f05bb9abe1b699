"""A run's results: the run directory ([`.rundir`][pflower.results.rundir]), its statistics
([`.statistics`][pflower.results.statistics]) and
its plots ([`.plots`][pflower.results.plots])."""
