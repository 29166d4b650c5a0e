"""One training run, measured: the trial's loop (``runner``), a model under a
configuration (``trainer``), the context it executes in (``context``: device, flags,
compiler, threads), timed bursts of one configuration for stage 1 (``bursts``), what a
process pays once (``warmup``), the clock (``timing``), the device's readings
(``telemetry``) and the validation split's score (``evaluation``).
"""
