"""Stage 1 of a two-stage study: the execution settings (pipeline, workers, compile,
channels_last, micro-batch split) timed in short bursts of real steps, planned and estimated
before it runs, within a budget, and cached per hardware, model and data in its own speed study.
Its modules, from the plan to the table stage 2 samples from: ARCHITECTURE.md.
"""
