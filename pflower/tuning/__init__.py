"""Fair comparisons (DESIGN contract 9): every method tuned on validation with the same budget.

- :mod:`pflower.searchspace` declares each option's range beside it (``tunable``);
- :mod:`.suite` reads a benchmark suite (``conf/suite/*.yaml``): settings, methods, budget;
- :mod:`.search` runs the Optuna studies (trials are pflower runs on validation shares), writes
  the chosen values and runs them with new seeds on test;
- :mod:`.cli` is ``pflower tune``; ``pflower report --leaderboard`` renders the results
  (:mod:`pflower.reporting.leaderboard`).
"""
