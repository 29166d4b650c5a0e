"""Space files: what parses, the defaults, and one clear message per problem."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.spacefile import (
    DDP_KNOBS,
    KNOBS,
    Choice,
    FloatRange,
    IntRange,
    SpecError,
    load_spec,
    parse_spec,
)

MINIMAL = "workload: {model: digits_cnn, data: digits}\n"
PRECISIONS = ", ".join(KNOBS["precision"].choices)  # fp32, fp32-strict, tf32, bf16, fp16


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "s.yaml")
    return caught.value.problems


def one_problem(text: str) -> str:
    found = problems(text)
    assert len(found) == 1, found
    return found[0]


def test_minimal_file_gets_documented_defaults():
    spec = parse_spec(MINIMAL, "minimal.yaml")
    assert spec.study.n_trials == 20
    assert spec.study.sampler == "tpe" and spec.study.pruner == "hyperband"
    assert spec.study.storage == "sqlite:///studies/autotune.db"
    assert spec.objective.metric == "accuracy_per_second"
    assert spec.objective.direction == "maximize"
    for name, info in KNOBS.items():
        knob = getattr(spec.space, name)
        assert knob == Choice(values=(info.default,)), name
    assert spec.space.searched() == []
    assert spec.study_name == "minimal"  # the file's stem when study.name is absent


def test_knob_forms_scalar_list_and_ranges():
    spec = parse_spec(
        MINIMAL
        + """
space:
  lr: {low: 1e-4, high: 1e-1, log: true}     # YAML reads 1e-4 as a string; still a number
  batch_size: [32, 64]
  num_workers: {low: 0, high: 4, step: 2}
  weight_decay: {low: 0.0, high: 0.1, step: 0.05}
  precision: bf16
  pin_memory: [false, true]
"""
    )
    assert spec.space.lr == FloatRange(low=1e-4, high=0.1, log=True)
    assert spec.space.batch_size == Choice(values=(32, 64))
    assert spec.space.num_workers == IntRange(low=0, high=4, step=2)
    assert spec.space.weight_decay == FloatRange(low=0.0, high=0.1, step=0.05)
    assert spec.space.precision == Choice(values=("bf16",)) and spec.space.precision.is_fixed
    assert spec.space.searched() == [
        "lr",
        "batch_size",
        "num_workers",
        "pin_memory",
        "weight_decay",
    ]


def test_models_are_frozen():
    spec = parse_spec(MINIMAL)
    with pytest.raises(Exception, match="frozen"):
        spec.study.n_trials = 3  # type: ignore[misc]


@pytest.mark.parametrize("name", ["run\\e[31m", "a\\nb", "a\\rb", "evil\\u202eexe", "nul\\0"])
def test_a_study_name_with_control_characters_is_refused(name: str):
    """Issue 41: the name is printed on terminals (and offered in commands to copy)."""
    problem = one_problem(f'study: {{name: "{name}"}}\n' + MINIMAL)
    assert "a study name cannot hold control or format characters" in problem


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "study: {n_trials: 100000000000000000000000}\n",
            "study.n_trials: must be less than or equal to 1000000",
        ),
        (
            "workload: {epochs: 1.0e+308}\n",
            "workload.epochs: must be less than or equal to 100000",
        ),
    ],
)
def test_counts_past_any_real_study_are_refused(text: str, said: str):
    """Issue 41: n_trials of 10**23 and epochs of 1e308 were accepted."""
    spec_text = (
        text + MINIMAL
        if text.startswith("study")
        else text.replace("{", "{model: digits_cnn, data: digits, ")
    )
    assert said in one_problem(spec_text)


def test_typo_names_file_line_and_closest_key():
    text = MINIMAL + "space:\n  lerning_rate: 0.1\n"
    assert one_problem(text) == "s.yaml:3: unknown key 'lerning_rate' in space; did you mean 'lr'?"


@pytest.mark.parametrize(
    ("section", "key", "suggestion"),
    [
        ("study", "n_trial", "n_trials"),
        ("study", "samplr", "sampler"),
        ("workload", "epoch", "epochs"),
        ("objective", "min_acc", "min_accuracy"),
        ("space", "learning_rate", "lr"),
        ("space", "gradient_accumulation_steps", "accumulation_steps"),
        ("space", "batchsize", "batch_size"),
    ],
)
def test_unknown_keys_in_every_section_suggest_the_closest(section, key, suggestion):
    extra = f"{section}: {{{key}: 1}}\n"
    if section == "workload":
        extra = f"workload: {{model: m, data: d, {key}: 1}}\n"
        text = extra
    else:
        text = MINIMAL + extra
    message = one_problem(text)
    assert f"unknown key '{key}' in {section}; did you mean '{suggestion}'?" in message


def test_unknown_top_level_section():
    message = one_problem(MINIMAL + "spcae: {}\n")
    assert message == "s.yaml:2: unknown key 'spcae' in the space file; did you mean 'space'?"


def test_a_misspelt_required_section_or_metric_is_one_line_that_names_the_right_one():
    """A new user's 'worklaod:' got "missing required key 'workload'" first and the
    did-you-mean second; a misspelt metric got no did-you-mean at all."""
    body = MINIMAL.replace("workload:", "worklaod:")
    assert one_problem(body) == (
        "s.yaml:1: unknown key 'worklaod' in the space file; did you mean 'workload'? "
        "(it is required)"
    )
    message = one_problem(MINIMAL + "objective: {metric: acuracy_per_second}\n")
    assert message.endswith(", got 'acuracy_per_second'; did you mean 'accuracy_per_second'?")


@pytest.mark.parametrize(
    ("knob_yaml", "expected"),
    [
        ("lr: {low: 0.1, high: 0.001}", "space.lr: low (0.1) is greater than high (0.001)"),
        ("weight_decay: {low: 0, high: 0.1, log: true}", "a log range needs low > 0"),
        ("lr: {low: 0.001, high: 0.1, log: true, step: 0.01}", "both log and step"),
        ("lr: {low: 0.001, high: 0.1, log: true, step: 1}", "both log and step"),
        ("lr: {low: 0.001}", "a range needs both low and high (missing high)"),
        ("lr: {low: 0.001, high: 0.1, lgo: true}", "unknown key 'lgo' in a range; did you mean"),
        ("batch_size: []", "space.batch_size: empty list"),
        ("batch_size: [32, 0]", "item 2: 0 is too small: must be >= 1"),
        ("batch_size: [32, 32]", "32 listed more than once"),
        ("batch_size: 12.5", "12.5 is not an integer"),
        (
            "precision: [fp32, fp8]",
            f"item 2: 'fp8' is not one of {PRECISIONS}",
        ),
        (
            "precision: [fp23]",
            f"'fp23' is not one of {PRECISIONS}; did you mean 'fp32'?",
        ),
        ("compile: false", "false is not one of none, default"),
        ("compile: max_autotune", "did you mean 'max-autotune'?"),
        ("pin_memory: maybe", "'maybe' is not true or false"),
        ("precision: {low: 1, high: 2}", "a range {low, high} only works for numeric knobs"),
        ("momentum: 1.5", "1.5 is too large: must be < 1"),
        ("lr: -0.1", "-0.1 is too small: must be > 0"),
        ("lr: .nan", "is not a finite number"),
        ("lr_scaling: [none, linear]", "a setting, not a searchable knob"),
        ("num_workers:", "no value given"),
    ],
)
def test_bad_knob_values(knob_yaml, expected):
    message = one_problem(MINIMAL + "space:\n  " + knob_yaml + "\n")
    assert message.startswith("s.yaml:3: space."), message
    assert expected in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("workload: {model: m}\n", "s.yaml:1: missing required key 'workload.data'"),
        (MINIMAL + "study: {n_trials: 0}\n", "study.n_trials: must be greater than or equal to 1"),
        (MINIMAL + "study: {pruner: asha}\n", "study.pruner: must be 'hyperband', 'median'"),
        (MINIMAL + "study: {seed: -1}\n", "study.seed: must be greater than or equal to 0"),
        (
            MINIMAL + "study: {seed: 99999999999999999999}\n",
            "study.seed: must be less than or equal to 4294967295",
        ),
        ("workload: {model: m, data: d, device: gpu}\n", "workload.device: 'gpu' is not a device"),
        (
            "workload: {model: m, data: d, epochs: 1, eval_every: 2}\n",
            "s.yaml:1: workload.eval_every: 2 epochs is longer than the trial",
        ),
        (
            MINIMAL + "objective: {metric: time_to_accuracy}\n",
            "s.yaml:2: objective.target_accuracy: metric time_to_accuracy needs a target",
        ),
        (
            MINIMAL + "objective: {target_accuracy: 0.9}\n",
            "objective.target_accuracy: applies only to metric time_to_accuracy",
        ),
        (
            MINIMAL + "objective:\n  metric: time_to_accuracy\n  target_accuracy: 0.9\n"
            "  full_run_epochs: 90\n",
            "objective.full_run_epochs: applies only to accuracy_per_second",
        ),
        (
            MINIMAL + "objective: {min_accuracy: 1.5}\n",
            "objective.min_accuracy: must be less than or equal to 1",
        ),
        (
            "workload: {model: m, data: d, epochs: 5}\nobjective:\n  full_run_epochs: 2\n",
            "s.yaml:3: objective.full_run_epochs: 2 is shorter than a trial",
        ),
        ("workload: 3\n", "workload: must be a mapping"),
        (  # names reach exported scripts as import lines: dotted identifiers only
            "workload: {model: 'os; import x:y', data: digits}\n",
            "workload.model: 'os; import x:y' is neither a built-in name nor",
        ),
        (  # "$" would accept a trailing line break; the whole name must match
            'workload: {model: "os:system\\n", data: digits}\n',
            "is neither a built-in name nor",
        ),
        (
            "workload: {model: 'autotune.testing:', data: digits}\n",
            "workload.model: 'autotune.testing:' is neither a built-in name nor",
        ),
        (
            "workload: {model: digits_cnn, data: digits, model_args: {'a=1)': 2}}\n",
            "workload.model_args: 'a=1)' is not a Python argument name",
        ),
        (  # a YAML date would reach an exported script as datetime.date(...), a NameError there
            "workload:\n  model: m\n  data: digits\n  data_args:\n    since: 2024-01-01\n",
            "s.yaml:5: workload.data_args.since: 2024-01-01 is a date, not plain data",
        ),
        (
            "workload: {model: m, data: d, model_args: {at: [1, {t: 2024-01-01 10:00:00}]}}\n",
            "workload.model_args.at[1].t: 2024-01-01 10:00:00 is a datetime, not plain data",
        ),
        ("", "this one is empty"),
        ("- a\n- b\n", "this one is list"),
        # another file passed by mistake: one line, its keys (perhaps secrets) not echoed
        ("root:*:20228:0:99999:7::\n", "this one is a mapping of 1 other key, none of them"),
        ("password: hunter2\ntoken: abc\n", "a mapping of 2 other keys, none of them a section"),
        ("study: [\n", "invalid YAML"),
    ],
)
def test_bad_sections(text, expected):
    message = one_problem(text)
    assert expected in message, message


def test_a_python_module_given_as_the_space_file_is_told_to_be_named_in_one():
    """A new user ran ``autotune run blobs.py`` and read only YAML's "expected '<document
    start>'": the line says what a space file is and where the module goes."""
    module = "import torch\n\ndef convnet(num_classes):\n    return torch.nn.Linear(4, 2)\n"
    with pytest.raises(SpecError) as caught:
        parse_spec(module, "models/blobs.py")
    (said,) = caught.value.problems
    assert said.startswith("models/blobs.py:") and "invalid YAML" in said
    assert said.endswith(
        "a space file is YAML: name this module's functions in it (workload.model: blobs:function)"
    )


def test_every_problem_is_reported_in_line_order():
    text = """\
study:
  n_trials: 0
workload:
  model: digits_cnn
  data: digits
space:
  lr: {low: 1, high: 0.1}
  batch_size: []
  lr: 0.3
"""
    found = problems(text)  # the second lr wins in YAML; the duplicate itself is reported
    assert [p.split(":")[1] for p in found] == ["2", "8", "9"]
    assert "duplicate key 'lr' in space (first at line 7)" in found[-1]


def test_load_spec_file_errors(tmp_path: Path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(tmp_path)
    path = tmp_path / "ok.yaml"
    path.write_text(MINIMAL)
    spec = load_spec(path)
    assert spec.path == path and spec.text == MINIMAL


def billion_laughs(levels: int) -> str:
    """A space file whose last key names 10**levels copies of one string through aliases."""
    lines = ['x0: &x0 "lol"']
    for level in range(1, levels + 1):
        lines.append(f"x{level}: &x{level} [{', '.join([f'*x{level - 1}'] * 10)}]")
    return MINIMAL + "\n".join(lines) + "\n"


def test_aliases_that_expand_beyond_a_space_file_are_refused_without_expanding_them():
    # 10**12 values if followed: the check must size shared nodes once, not walk them
    message = one_problem(billion_laughs(12))
    assert "aliases expand to more than 20,000 values" in message, message
    assert "aliases expand" in one_problem(MINIMAL + "loop: &loop [1, *loop]\n")
    # aliases a person would write are fine: one list of sizes shared by two knobs
    shared = MINIMAL + "space:\n  batch_size: &sizes [2, 4]\n  accumulation_steps: *sizes\n"
    spec = parse_spec(shared, Path("s.yaml"))
    assert spec.space.batch_size == spec.space.accumulation_steps == Choice(values=(2, 4))


def test_a_space_file_larger_than_any_space_file_is_refused_before_parsing(tmp_path: Path):
    path = tmp_path / "huge.yaml"
    path.write_text(MINIMAL + "#" * 1_000_001 + "\n")
    with pytest.raises(SpecError, match="too large for a space file") as caught:
        load_spec(path)
    assert len(caught.value.problems) == 1
    with pytest.raises(SpecError, match="too large for a space file"):
        parse_spec(path.read_text(), path)


def test_overrides_are_validated_and_keep_the_source():
    spec = parse_spec(MINIMAL, Path("q.yaml"))
    changed = spec.with_overrides(study={"n_trials": 5, "seed": None}, workload={"device": "cpu"})
    assert changed.study.n_trials == 5 and changed.study.seed == 0
    assert changed.workload.device == "cpu"
    assert changed.text == MINIMAL and changed.study_name == "q"
    with pytest.raises(SpecError) as caught:
        spec.with_overrides(workload={"device": "tpu"})
    assert caught.value.problems == [
        "workload.device: 'tpu' is not a device: use auto, cpu, cuda or cuda:N"
    ]
    with pytest.raises(SpecError, match=r"study\.isolation: must be 'worker' or 'none'"):
        spec.with_overrides(study={"isolation": "thread"})
    with pytest.raises(SpecError, match=r"^study\.seed: must be less than or equal to 4294967295"):
        spec.with_overrides(study={"seed": 2**32})  # --seed 4294967296
    with pytest.raises(SpecError) as caught:
        spec.with_overrides(study={"n_trial": 5})
    assert caught.value.problems == ["unknown key 'n_trial' in study; did you mean 'n_trials'?"]
    with pytest.raises(TypeError, match="not space"):  # its knobs are parsed: not file input
        spec.with_overrides(space={"precision": ["fp32"]})
    # a check across sections names its own place, not the section last overridden
    auto = parse_spec(MINIMAL + "space: {batch_size: auto}\n")
    with pytest.raises(SpecError) as caught:
        auto.with_overrides(study={"strategy": "joint"})
    assert caught.value.problems[0].startswith("space.batch_size: auto is probed before stage 1")


def test_fingerprint_covers_the_search_but_not_the_run_settings():
    base = parse_spec(MINIMAL + "space: {batch_size: [16, 32]}\n")
    more_trials = parse_spec(MINIMAL + "study: {n_trials: 99}\nspace: {batch_size: [16, 32]}\n")
    other_space = parse_spec(MINIMAL + "space: {batch_size: [16, 64]}\n")
    other_objective = parse_spec(
        MINIMAL + "objective: {min_accuracy: 0.5}\nspace: {batch_size: [16, 32]}\n"
    )
    assert base.search_fingerprint() == more_trials.search_fingerprint()
    assert base.search_fingerprint() != other_space.search_fingerprint()
    assert base.search_fingerprint() != other_objective.search_fingerprint()


def test_batch_size_auto_starts_at_the_baseline_batch_and_keeps_its_search_when_resolved():
    pinned = parse_spec(
        MINIMAL + "study: {baseline: {batch_size: 16}}\nspace: {batch_size: auto}\n"
    )
    assert pinned.space.batch_size == Choice(values=(16,), auto=True)
    assert pinned.space.batch_size_auto and pinned.space.searched() == []
    unpinned = parse_spec(MINIMAL + "space: {batch_size: auto}\n")
    assert unpinned.space.batch_size.values == (KNOBS["batch_size"].default,)
    # the probe's list is the same search (every process and resume), a listed one is not
    resolved = pinned.with_batch_sizes((16, 32, 64))
    assert resolved.space.batch_size.values == (16, 32, 64) and resolved.space.batch_size_auto
    assert resolved.search_fingerprint() == pinned.search_fingerprint()
    assert resolved.space.searched() == ["batch_size"] and resolved.text == pinned.text
    listed = parse_spec(MINIMAL + "study: {baseline: {batch_size: 16}}\nspace: {batch_size: 16}\n")
    assert listed.search_fingerprint() != pinned.search_fingerprint()
    assert not listed.space.batch_size_auto


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "study: {strategy: joint}\nspace:\n  batch_size: auto\n",
            "s.yaml:4: space.batch_size: auto is probed before stage 1 of a two-stage study",
        ),
        ("space:\n  lr: 0.1\n  num_workers: auto\n", "s.yaml:4: space.num_workers: auto is only"),
        ("space:\n  precision: auto\n", "s.yaml:3: space.precision: auto is only for batch_size"),
        ("space:\n  batch_size: [auto]\n", "s.yaml:3: space.batch_size: item 1: 'auto' is not"),
    ],
)
def test_batch_size_auto_where_it_means_nothing_is_one_line_with_its_place(text: str, said: str):
    assert one_problem(MINIMAL + text).startswith(said)


def test_shipped_space_files_are_valid():
    paths = sorted(Path(__file__).parents[1].glob("search_spaces/*.yaml"))
    assert "quickstart.yaml" in {path.name for path in paths}, "the glob found no space files"
    for path in paths:
        load_spec(path)


def test_the_space_file_page_documents_every_knob_with_its_default():
    page = (Path(__file__).parents[1] / "docs" / "space-file.md").read_text()
    for name, info in KNOBS.items():
        default = str(info.default).lower() if isinstance(info.default, bool) else info.default
        assert f"| `{name}` | {default} |" in page, name


# One value per knob that differs from its default and is valid, and the knobs that must be set
# for it to be sampled at all (its ``only_when``).
OTHER_VALUE = {
    "lr": 0.02,
    "lr_scaling": "linear",
    "base_batch_size": 128,
    "batch_size": 48,
    "accumulation_steps": 2,
    "data_pipeline": "device",
    "num_workers": 2,
    "pin_memory": True,
    "prefetch_factor": 4,
    "persistent_workers": True,
    "precision": "bf16",
    "compile": "default",
    "optimizer": "sgd",
    "weight_decay": 0.05,
    "momentum": 0.5,
    "nesterov": True,
    "schedule": "cosine",
    "warmup_fraction": 0.25,
    "channels_last": True,
    "cudnn_benchmark": True,
    "ddp_bucket_cap_mb": 50,
    "gradient_as_bucket_view": True,
    "static_graph": True,
}
NEEDS = {
    "prefetch_factor": {"num_workers": 2},
    "persistent_workers": {"num_workers": 2},
    "momentum": {"optimizer": "sgd"},
    "nesterov": {"optimizer": "sgd"},
}


@pytest.mark.parametrize("name", list(KNOBS))
def test_every_knob_reaches_the_configuration_and_the_script(name: str):
    """A knob added to the registry (knobs.KNOBS) and not to the sampler, TrialConfig or the
    exported script fails here."""
    import optuna
    import yaml

    from autotune.config import TrialConfig
    from autotune.search.space import sample
    from autotune.testing import CPU

    info = KNOBS[name]
    value = OTHER_VALUE[name]
    assert value != info.default, name
    assert name in {f.name for f in dataclasses.fields(TrialConfig)}, name
    assert info.script, f"say in the registry's script where the exported script applies {name}"
    fixed = NEEDS.get(name, {})
    # searched knobs as a list of two values, settings (one value only) as that value
    space = {name: [info.default, value] if info.searchable else value, **fixed}
    workload = {"model": "mlp", "data": "digits", "device": "cpu"}
    if name in DDP_KNOBS:  # DDP's settings need a trial of several processes
        workload["gpus_per_trial"] = 2
    text = yaml.safe_dump({"workload": workload, "space": space})
    spec = parse_spec(text)
    params = {name: value} if info.searchable else {}
    config = sample(optuna.trial.FixedTrial(params, number=0), spec, CPU)
    field = "base_lr" if name == "lr" else name
    assert getattr(config, field) == value, (name, config)


def test_every_knob_has_another_value_to_be_tried_with():
    assert set(OTHER_VALUE) == set(KNOBS)


def test_ddp_settings_need_a_trial_of_several_processes():
    text = "workload: {model: mlp, data: digits}\nspace:\n  static_graph: [false, true]\n"
    with pytest.raises(SpecError) as raised:
        parse_spec(text, "ddp.yaml")
    assert raised.value.problems == [
        "ddp.yaml:3: space.static_graph: a DistributedDataParallel setting; it applies only to "
        "trials of several processes (workload.gpus_per_trial: 2 or more)"
    ]
    spec = parse_spec(text.replace("digits}", "digits, gpus_per_trial: 2}"))
    assert spec.workload.gpus_per_trial == 2 and spec.space.searched() == ["static_graph"]
    # a file written before DDP existed keeps its search fingerprint (its studies resume)
    payload = parse_spec(MINIMAL).search_payload()
    assert "gpus_per_trial" not in payload["workload"]
    assert not set(DDP_KNOBS) & set(payload["space"])
