"""The machine a study runs on: hardware, interference, turns, ranks, scale-out shares."""
