"""One training run, measured: the trial's loop, the trainer, bursts for stage 1, the clocks."""
