"""Fair comparisons: every method tuned on validation with the same budget (docs: concepts,
fair comparisons; guide, tuning).

- [`pflower.searchspace`][pflower.searchspace] declares each option's range beside it (``tunable``);
- [`.suite`][pflower.tuning.suite] reads a benchmark suite (``conf/suite/*.yaml``): settings,
  methods, budget;
- [`.search`][pflower.tuning.search] runs the Optuna studies (trials are pflower runs on validation
  shares); [`.finals`][pflower.tuning.finals] writes the chosen values and runs them with new
  seeds on test;
- [`.cli`][pflower.tuning.cli] is ``pflower tune``; ``pflower report --leaderboard`` renders the
  results
  ([`pflower.reporting.leaderboard`][pflower.reporting.leaderboard]).
"""
