"""Tiny workloads and fault-injection hooks for autotune's own tests (and for trying it out).

Use them from a space file like any user's workload::

    workload:
      model: autotune.testing:tiny_mlp
      model_args: {nan_after_steps: 3}          # a fault to inject, if any
      data: autotune.testing:blobs
      data_args: {kill_worker_at_item: 20}

They train in a fraction of a second on a CPU, so a whole study fits in a test. Each fault hook
reproduces a real failure the way it happens in real training: the real exception type, a real
signal, a real sleep, a real broken compiler. The rest is what tests of a study share: this
machine and described ones, a plain TrialConfig, a tiny space file, the real ``autotune``
command in a subprocess.
"""

# ruff: noqa: F401  (this package re-exports what its modules define)
from autotune.testing._commands import (
    TINY_SPACE,
    import_blocker,
    imported_modules,
    lint,
    provenance,
    run_cli,
    run_python,
    run_script,
    start_cli,
    write_space,
)
from autotune.testing._trials import (
    AMPERE,
    CPU,
    TEST_CPU,
    VOLTA,
    assert_trials_recorded,
    beat_long_ago,
    cuda_flags,
    learning_rates,
    live_group_members,
    make_config,
    make_evaluation,
    make_result,
    never_stop,
)
from autotune.testing._workloads import (
    FaultyDataset,
    blobs,
    blobs_workload,
    broken_model,
    leaky_cnn,
    tiny_cnn,
    tiny_mlp,
)
