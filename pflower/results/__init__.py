"""A run's results: the run directory (:mod:`.rundir`), its statistics (:mod:`.statistics`) and
its plots (:mod:`.plots`)."""
