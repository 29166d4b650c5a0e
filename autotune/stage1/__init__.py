"""Stage 1 of a two-stage study: the execution settings (pipeline, workers, compile,
channels_last, micro-batch split) timed in short bursts of real steps, planned and estimated
before it runs, within a budget, and cached per hardware, model and data in its own speed study.

- ``_plan``: what it measures and in what order (the cells, the references, the estimate);
- ``_budget``: what fits the budget; ``_rules``: what it leaves out and why;
- ``_take``: one setting timed (claimed through the storage so each is measured once,
  ``_claims``); ``_store``: the speed study that records and caches it;
- ``_table``: its answer, the speed table stage 2 samples from; ``_stage``: the stage that
  runs it.
"""
