"""Byzantine clients and robust aggregation, usable with every algorithm.

- [`.attacks`][pflower.robust.attacks]: which clients are malicious (one pure function that the
  server and the clients
  share) and what a model-poisoning client uploads (FLAME paper, Zhu et al., Sec. VI-B3);
- `.aggregators`: Multi-Krum (Blanchard et al., NeurIPS 2017), coordinate-wise trimmed mean
  and median (Yin et al., ICML 2018), on top of Flower's implementations; norm-difference
  clipping at a multiple of the round's median update norm (Sun et al., 2019); when a configured
  aggregator cannot act (`.aggregators.idle`).
"""
