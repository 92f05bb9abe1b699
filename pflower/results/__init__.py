"""A run's results: the run directory ([`.rundir`][pflower.results.rundir]), with its rows
([`.rows`][pflower.results.rows]), summary ([`.summary`][pflower.results.summary]) and failure
records ([`.failures`][pflower.results.failures]), its statistics
([`.statistics`][pflower.results.statistics]) and its plots ([`.plots`][pflower.results.plots])."""
