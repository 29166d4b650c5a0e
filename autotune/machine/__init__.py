"""The machine a study runs on: its hardware (``hardware``), what else runs on it
(``interference``), the turns its processes take on the training device (``turns``), the
ranks of a distributed trial (``ranks``), and its cores and GPUs shared among ``--workers``
processes (``scaleout``).
"""
