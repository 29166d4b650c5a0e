"""The ``autotune`` command end to end, as a user runs it: in a subprocess where the process is
the subject (a worker, the environment, what it imports), in this process (Typer's CliRunner,
``invoke_cli``) where a new interpreter and torch would cost seconds and test nothing more."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import sqlite3
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune import display, session
from autotune import study as studies
from autotune._version import __version__
from autotune.cli._run import _other_cores
from autotune.machine.scaleout import WorkerShare
from autotune.study import StudyError, StudyRecord, answer_trial, load_study
from autotune.testing import CPU, TINY_SPACE, import_blocker, run_cli, run_python, write_space

pytestmark = pytest.mark.slow


# both stages and the confirmation round, each as small as it goes: one leader confirmed with
# the untuned baseline, one more run each; stage 1 times each setting once, in one burst. No
# tuning checklist: it is not what this test looks at, and it can be the answer while its own
# trial scored under min_accuracy (most of its runs in the round did not)
SMALL_ROUNDS = (
    "  seed: 0\n  checklist: false\n  confirm: {top: 1, repeats: 2}\n"
    "  speed: {repeats: 1, bursts: 1}\n"
)


def test_run_then_best_then_resume(invoke_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # the CUDA images autotune meets may lack plotly: only `autotune report` draws with it
    without_plotly = {"PYTHONPATH": str(import_blocker(tmp_path, "plotly"))}
    space = write_space(tmp_path, n_trials=4, pruner="hyperband")
    space.write_text(space.read_text().replace("  seed: 0\n", SMALL_ROUNDS))
    done = run_cli("run", str(space), cwd=tmp_path, env=without_plotly)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "not searched: precision fp16" in done.stdout
    assert "not searched: pin_memory true" in done.stdout
    assert "Best configuration (trial" in done.stdout
    assert "autotune dashboard" in done.stdout

    db = tmp_path / "studies" / "autotune.db"
    assert db.exists()
    with sqlite3.connect(db) as connection:  # the dashboard and other writers can read along
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{db}")
    trials = study.get_trials()
    assert len(trials) == 4
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert complete, "no trial completed"
    for trial in complete:
        for key in ("score", "train_seconds", "samples_per_second", "effective_batch_size"):
            assert key in trial.user_attrs
    assert study.best_trial.user_attrs["score"] >= 0.5  # feasible under min_accuracy

    # `run` ends with the confirmation round; its winner, not the best single value, is the
    # answer that the run prints and `best` shows
    answer = answer_trial(study)
    assert answer is not None and StudyRecord.of(study).confirmation is not None
    assert StudyRecord.of(study).confirmation.complete
    assert f"Answer: trial {answer.number}" in done.stdout
    # reads in this process (the probe test below checks they need no plotly)
    best = invoke_cli("best", "--study", "tiny", "--json", cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    payload = json.loads(best.stdout)
    assert payload["trial"] == answer.number
    assert payload["trial_value"] == pytest.approx(answer.value)
    assert payload["value"] == pytest.approx(studies.answer_of(study).median)  # as shown
    assert payload["config"] == answer.user_attrs["config"]
    assert payload["metrics"]["score"] >= 0.5
    shown = invoke_cli("best", cwd=tmp_path)  # no --study: the storage's only study (and .speed)
    # "confirmed under load: median" where other processes took the cores (the machine's)
    assert shown.returncode == 0 and re.search(r"confirmed( under load)?: median", shown.stdout)
    assert shown.stdout.startswith("tiny: trial ")
    # its first figure is the round's median, said so, not the trial's one measurement
    headline = shown.stdout.splitlines()[0]
    confirmed = studies.answer_of(study)
    assert confirmed is not None and confirmed.median is not None
    assert display.fmt(confirmed.median) in headline and "confirmed run" in headline, headline

    listed = invoke_cli("studies", cwd=tmp_path)
    assert listed.returncode == 0 and "tiny" in listed.stdout
    # export and report in this process, as if plotly were not installed: export needs none,
    # report imports it when it draws
    hidden = [name for name in sys.modules if name == "plotly" or name.startswith("plotly.")]
    for name in hidden or ["plotly"]:
        monkeypatch.setitem(sys.modules, name, None)
    exported = invoke_cli("export", "--study", "tiny", "-o", "t.py", cwd=tmp_path)
    assert exported.returncode == 0 and (tmp_path / "t.py").exists(), exported.stderr
    report = invoke_cli("report", "--study", "tiny", cwd=tmp_path)
    monkeypatch.undo()
    assert report.returncode == 1 and "Traceback" not in report.stderr
    assert "autotune report needs plotly" in report.stdout + report.stderr
    assert not (tmp_path / "report.html").exists()

    # resumed in this process's trials (no worker: what is resumed is the study)
    again = invoke_cli("run", str(space), "--n-trials", "6", "--isolation", "none", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resuming with" in again.stdout
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{db}")
    assert len(study.get_trials()) == 6
    assert [t.params for t in study.get_trials()][:4] == [t.params for t in trials]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "workload: {model: digits_cnn, data: digits}\nspace:\n  lerning_rate: 0.1\n",
            "bad.yaml:3: unknown key 'lerning_rate' in space; did you mean 'lr'?",
        ),
        (
            "workload: {model: digits_cnn, data: digits}\nspace:\n  precision: fp16\n",
            "space.precision: no value can run on cpu: fp16",
        ),
        ("workload: {model: digits_cnn, data: digitz}\n", "unknown data set 'digitz'"),
        ("workload: {model: m, data: d, device: cuda}\n", "has no usable CUDA GPU"),
    ],
)
def test_user_errors_are_one_line_exit_2_and_create_nothing(
    invoke_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text, expected
):
    space = write_space(tmp_path, text=text, name="bad.yaml")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # the worker's scratch goes there
    done = invoke_cli("run", str(space), cwd=tmp_path, env={"TMPDIR": str(scratch)}, columns=80)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    # one line at any terminal width (here 80 columns): never wrapped
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert not (tmp_path / "studies").exists()
    # the worker started while the workload was checked here went, with its scratch folder
    assert not list(scratch.glob("autotune-worker-*"))


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_gpus_that_would_train_on_the_cpu_are_refused_before_the_study_opens(
    tmp_path: Path, device: str
):
    """``run --gpus 9`` of a CPU study, or of device auto where no GPU 9 exists, trained the
    whole study on the CPU and exited 0."""
    space = write_space(tmp_path, n_trials=1)
    args = ("run", str(space), "--gpus", "99", "--device", device, "--isolation", "none")
    done = run_cli(*args, cwd=tmp_path, env={"COLUMNS": "80"})
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --gpus 99: "), lines
    assert "would train on the CPU" in lines[0] or "trains on the CPU" in lines[0]
    assert not (tmp_path / "studies").exists()


def test_missing_file_and_unknown_study(invoke_cli, tmp_path: Path):
    missing = invoke_cli("run", "nope.yaml", cwd=tmp_path)
    assert missing.returncode == 2 and "nope.yaml: no such file" in missing.stderr
    no_db = invoke_cli("best", "--study", "x", cwd=tmp_path, columns=80)
    looked = tmp_path.resolve() / "studies" / "autotune.db"  # where, from wherever it runs
    assert no_db.returncode == 1 and "Traceback" not in no_db.stderr
    assert no_db.stderr.splitlines() == [
        f"error: no study database at {looked}; name the storage with --storage URL (or set "
        "AUTOTUNE_STORAGE)"
    ]  # one line at 80 columns, never wrapped
    assert not (tmp_path / "studies").exists()


ONE_STAGE = "  seed: 0\n  strategy: joint\n  confirm: false\n"  # these tests are not about them


def test_edited_space_is_refused_until_new_study(invoke_cli, tmp_path: Path):
    space = write_space(tmp_path, n_trials=1)
    space.write_text(space.read_text().replace("  seed: 0\n", ONE_STAGE))
    assert invoke_cli("run", str(space), "--isolation", "none", cwd=tmp_path).returncode == 0
    space.write_text(space.read_text().replace("[16, 32]", "[16, 64]"))
    refused = invoke_cli("run", str(space), cwd=tmp_path)  # refused before it trains
    assert refused.returncode == 2
    assert "the space file changed" in refused.stderr and "[16, 64]" in refused.stderr
    fresh = invoke_cli("run", str(space), "--new-study", "--isolation", "none", cwd=tmp_path)
    assert fresh.returncode == 0 and "study tiny-2" in fresh.stdout
    unknown = invoke_cli("best", "--study", "tiyn", cwd=tmp_path)
    assert unknown.returncode == 1 and "did you mean 'tiny'?" in unknown.stderr
    url = f"sqlite:///{tmp_path}/studies/autotune.db"
    with pytest.raises(
        StudyError, match=r"holds 2 studies \(tiny, tiny-2\): name one with --study"
    ):
        load_study(None, url)


def test_a_run_on_other_cores_than_its_study_says_so_in_its_plan_with_what_to_do(
    invoke_cli, prepare_study, tmp_path: Path
):
    """A study started on the whole CPU and resumed with --workers (each on a share of the
    cores) warned only of another device's name, in two lines, and said nothing of what to do:
    the plan says it in one line, before anything trains."""
    before = CPU.cpu_count + 1  # cores this machine's run does not have
    text = TINY_SPACE.format(n_trials=1, pruner="none").replace("  seed: 0\n", ONE_STAGE)
    prepare_study(text, tmp_path, run=False, hardware=replace(CPU, cpu_count=before))
    done = invoke_cli("run", "space.yaml", "--isolation", "none", cwd=tmp_path, columns=80)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("warning: study tiny's")]
    assert len(said) == 1, done.stdout
    assert lines[said[0]] == (
        f"warning: study tiny's trials trained on {before} cores, this run on "
        f"{display.plural(CPU.cpu_count, 'core')}: their times will not compare; name a new "
        f"study (--study-name tiny-{CPU.cpu_count}cores)"
    )
    first_trial = next(i for i, line in enumerate(lines) if "trial   0" in line)
    assert said[0] < first_trial, done.stdout  # in the plan, before it trains
    # with --workers: each share's cores, and dropping --workers as the other way
    prepared = session.Prepared(
        spec=None,  # type: ignore[arg-type]  # what the line reads: the study, the machine
        hardware=replace(CPU, cpu_count=1),
        workload=None,  # type: ignore[arg-type]
        dropped=(),
        study=load_study("tiny", f"sqlite:///{tmp_path}/studies/autotune.db"),
        retry=None,  # type: ignore[arg-type]
    )
    shares = [WorkerShare(index, 2, (index,), None) for index in range(2)]
    line = _other_cores(prepared, shares) or ""
    assert line.startswith(f"study tiny's trials trained on {before} cores, --workers 2 trains ")
    assert "each on 1 core: their times will not compare; name a new study (--study-name " in line
    assert "tiny-2workers)" in line


def test_a_study_name_with_markup_and_spaces_is_shown_as_it_is(invoke_cli, tmp_path: Path):
    """rich reads ``[...]`` as markup: ``x[/y]`` crashed the display and ``run[fast]`` showed as
    ``run``. Names are the user's data: shown verbatim, and quoted in commands to copy."""
    name = "run[fast] x[/y]"
    space = write_space(tmp_path, n_trials=1)
    space.write_text(space.read_text().replace("  seed: 0\n", ONE_STAGE))
    done = invoke_cli("run", str(space), "--study-name", name, "--isolation", "none", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"study {name} (" in done.stdout
    assert f"Best trials of {name}" in done.stdout
    assert f"autotune best --study '{name}'" in done.stdout  # a command that works when pasted
    best = invoke_cli("best", "--study", name, cwd=tmp_path)
    assert best.returncode == 0 and f"{name}: trial 0" in best.stdout, best.stderr
    assert f"autotune export --study '{name}' -o train.py" in best.stdout
    listed = invoke_cli("studies", cwd=tmp_path)
    assert listed.returncode == 0 and name in listed.stdout, listed.stderr
    exported = invoke_cli("export", "--study", name, "-o", "t.py", cwd=tmp_path)
    assert exported.returncode == 0 and f"of {name} (" in exported.stdout, exported.stderr
    for result in (done, best, listed, exported):
        assert "Traceback" not in result.stderr


def test_stored_names_and_values_are_shown_as_text(invoke_cli, seen, tmp_path: Path):
    """A study database is data: markup ("[/x]") and emoji codes (":fire:") in a study name, a
    stored configuration value or the metric are shown as they are (a device "cpu [/x]" written
    into the database made ``autotune best`` crash with a MarkupError)."""
    study, url = seen
    name = ":fire: study [/x]"
    copy = f"sqlite:///{tmp_path / 'copy.db'}"
    optuna.copy_study(
        from_study_name=study.study_name, from_storage=url, to_storage=copy, to_study_name=name
    )
    with sqlite3.connect(tmp_path / "copy.db") as connection:
        rows = connection.execute(
            "SELECT trial_user_attribute_id, value_json FROM trial_user_attributes "
            "WHERE key = 'config'"
        ).fetchall()
        for row, value in rows:
            config = {**json.loads(value), "device": "cpu [/x] :fire:"}
            connection.execute(
                "UPDATE trial_user_attributes SET value_json = ? "
                "WHERE trial_user_attribute_id = ?",
                (json.dumps(config), row),
            )
        connection.execute(
            "UPDATE study_user_attributes SET value_json = ? WHERE key = 'metric'",
            (json.dumps("acc [/m] :fire:"),),
        )
    best = invoke_cli("best", "--study", name, "--storage", copy, cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    assert f"{name}: trial" in best.stdout and "acc [/m] :fire:" in best.stdout
    assert "cpu [/x] :fire:" in best.stdout and "\N{FIRE}" not in best.stdout
    listed = invoke_cli("studies", "--storage", copy, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert name in listed.stdout and "acc [/m] :fire:" in listed.stdout
    assert "\N{FIRE}" not in listed.stdout


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # a trial asked, not optimized
def test_studies_delete_keeps_stage_ones_cache_while_another_study_may_reuse_it(
    invoke_cli, prepare_study, tmp_path: Path
):
    """A new user found no way to delete dead studies. ``studies --delete`` refuses a study
    that runs, and keeps its speed study (stage 1's cache, read in place by every study of the
    storage) until no study left may reuse it; a joint study (no stage 1) reuses nothing."""
    space = TINY_SPACE.format(n_trials=2, pruner="none").replace("  seed: 0\n", SMALL_ROUNDS)
    for name in ("a", "b"):  # the same machine, model and data: b reuses a's measurements
        prepare_study(space.replace("name: tiny", f"name: {name}"), tmp_path)
    joint = TINY_SPACE.format(n_trials=2, pruner="none").replace("  seed: 0\n", ONE_STAGE)
    prepare_study(joint.replace("name: tiny", "name: c"), tmp_path, run=False)
    url = f"sqlite:///{tmp_path}/studies/autotune.db"

    def names() -> list[str]:
        return sorted(optuna.get_all_study_names(url))

    assert names() == ["a", "a.speed", "b", "b.speed", "c"]
    # a trial of a trains now (its heartbeat beats): refused, and nothing deleted
    beating = studies.open_storage(url, "write", heartbeat_interval=10)
    trial = optuna.load_study(study_name="a", storage=beating).ask()
    beating.record_heartbeat(trial._trial_id)
    refused = invoke_cli("studies", "--delete", "a", cwd=tmp_path, columns=80)
    assert refused.returncode == 1 and refused.stdout == "", refused.stdout
    assert refused.stderr.splitlines() == [
        "error: study a is running (1 trial training): let it end first"
    ]
    assert names() == ["a", "a.speed", "b", "b.speed", "c"]
    optuna.load_study(study_name="a", storage=beating).tell(trial, state=TrialState.FAIL)
    with studies.study_lock(load_study("a", url, "write"), "confirm"):  # a round runs
        confirming = invoke_cli("studies", "--delete", "a", cwd=tmp_path, columns=80)
    assert confirming.returncode == 1 and names()[0] == "a", confirming.stdout
    assert confirming.stderr.splitlines() == [
        "error: study a is running (its confirmation round): let it end first"
    ]

    own = invoke_cli("studies", "--delete", "a.speed", cwd=tmp_path, columns=200)
    assert own.returncode == 1 and "it goes with its study" in own.stderr, own.stderr
    done = invoke_cli("studies", "--delete", "a", cwd=tmp_path, columns=200)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "Deleted study a (3 trials) from sqlite:///studies/autotune.db.",
        "Kept a.speed (stage 1's measurements): b may reuse them (the same machine, model and "
        "data); it goes with the last study that may.",
    ]
    assert names() == ["a.speed", "b", "b.speed", "c"]
    kept = invoke_cli("studies", "--delete", "a.speed", cwd=tmp_path, columns=200)
    assert kept.returncode == 1 and "that b may reuse" in kept.stderr, kept.stderr

    last = invoke_cli("studies", "--delete", "b", cwd=tmp_path, columns=200)
    assert last.returncode == 0, last.stderr
    lines = last.stdout.splitlines()
    assert lines[0] == "Deleted study b (2 trials) from sqlite:///studies/autotune.db."
    assert lines[1].startswith("Deleted a.speed: its ") and lines[1].endswith(
        "stage-1 measurements, which no study left here may reuse."
    )
    assert names() == ["c"]  # a joint study reuses nothing
    gone = invoke_cli("studies", "--delete", "b", cwd=tmp_path, columns=200)
    assert gone.returncode == 1 and "error: no study 'b' in" in gone.stderr, gone.stderr


def test_help_shows_flags_as_flags_and_version(invoke_cli, tmp_path: Path):
    """Typer showed ``--new-study <bool>``: ``--new-study true`` looked right and was refused."""
    commands = ("run", "export", "best", "verify")
    for args in (("--help",), *((command, "--help") for command in commands)):
        shown = invoke_cli(*args, cwd=tmp_path, columns=80)
        assert shown.returncode == 0, shown.stderr
        assert "<bool>" not in shown.stdout, shown.stdout
    assert "--new-study " in invoke_cli("run", "--help", cwd=tmp_path).stdout
    version = invoke_cli("--version", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"autotune {__version__}"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("nosuch",), "No such command 'nosuch'; see "),
        (("--bogus",), "No such option: --bogus; see "),
        (("run",), "Missing argument 'SPACE_FILE'; see "),
        (("run", "x.yaml", "--n-trials", "many"), "Invalid value for '--n-trials'"),
        (("confirm", "space.yaml"), "unexpected extra argument(s) (space.yaml); see "),
        (("best", "--trial", "one"), "Invalid value for '--trial'"),
        (("export", "--format"), "Option '--format' requires an argument"),
        (("report", "--bogus"), "No such option: --bogus"),
        (("dashboard", "--port", "http"), "Invalid value for '--port'"),
        (("studies", "--json", "yes"), "unexpected extra argument(s) (yes)"),
    ],
)
def test_a_wrong_argument_is_one_line_and_exit_2(invoke_cli, tmp_path: Path, args, expected):
    """Typer drew a wrong option, value or command in a box of several lines, under the usage
    line: every other user error is one line."""
    done = invoke_cli(*args, cwd=tmp_path, columns=80)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert "╭" not in done.stdout + done.stderr and not (tmp_path / "studies").exists()


def test_help_reads_as_sentences_at_80_columns(invoke_cli, tmp_path: Path):
    """A new user's --help at 80 columns broke verify's summary mid-sentence ("reaches the
    target" / "first"), confirm's paragraph at the source's line breaks, and showed run's
    argument as ``{space_file}``."""
    root = invoke_cli("--help", cwd=tmp_path, columns=80).stdout.splitlines()
    start = next(i for i, line in enumerate(root) if "Commands" in line) + 1
    rows = root[start : next(i for i, line in enumerate(root) if i > start and "╰" in line)]
    assert [row.split()[1] for row in rows] == [
        *("run", "confirm", "verify", "best", "export", "report", "dashboard", "studies")
    ], "\n".join(root)  # a summary each, of one line
    for command in ("confirm", "verify", "run"):
        lines = invoke_cli(command, "--help", cwd=tmp_path, columns=80).stdout.splitlines()
        above_the_options = lines[: next(i for i, line in enumerate(lines) if "╭" in line)]
        prose = "\n".join(line.strip() for line in above_the_options).strip()
        for paragraph in prose.split("\n\n")[1:]:  # after the usage line: filled lines
            assert all(len(line) > 60 for line in paragraph.splitlines()[:-1]), prose
    assert prose.splitlines()[0].endswith(" run [OPTIONS] SPACE_FILE"), prose


def test_autotune_storage_is_every_commands_default_storage(invoke_cli, seen, tmp_path: Path):
    """The default storage is relative to the current folder; AUTOTUNE_STORAGE names one for
    every command run from anywhere."""
    _, url = seen
    env = {"AUTOTUNE_STORAGE": url}
    best = invoke_cli("best", "--study", "seen", "--json", cwd=tmp_path, env=env)
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["trial"] is not None
    listed = invoke_cli("studies", cwd=tmp_path, env=env)
    assert listed.returncode == 0 and "seen" in listed.stdout, listed.stderr
    assert "AUTOTUNE_STORAGE" in invoke_cli("best", "--help", cwd=tmp_path).stdout


def test_a_bad_artifact_store_is_one_line_and_writes_nothing(invoke_cli, seen, tmp_path: Path):
    """--artifacts (or AUTOTUNE_ARTIFACTS) is checked before the file is written."""
    _, url = seen
    cases: list[tuple[dict[str, str], tuple[str, ...]]] = [
        ({}, ("--artifacts", "ftp://host/x")),
        ({"AUTOTUNE_ARTIFACTS": "s3://A"}, ()),
    ]
    if importlib.util.find_spec("boto3") is None:  # a bucket, but nothing to reach it with
        cases.append(({}, ("--artifacts", "s3://team-studies")))
    for env, args in cases:
        done = invoke_cli(
            "export",
            "--study",
            "seen",
            "--storage",
            url,
            "-o",
            "t.py",
            *args,
            cwd=tmp_path,
            env=env,
        )
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("error: --artifacts ") and "Traceback" not in done.stderr
        assert not (tmp_path / "t.py").exists()
    folder = tmp_path / "kept"
    env = {"AUTOTUNE_ARTIFACTS": str(folder)}
    done = invoke_cli(
        "report", "--study", "seen", "--storage", url, "-o", "r.html", cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr
    assert [p.name for p in folder.iterdir()] and (tmp_path / "r.html").is_file()


# Runs commands one after another in one fresh interpreter, as the console script runs each;
# after each it prints a separator on stdout and names the heavy packages loaded so far on
# stderr: a command that loads one shows it on its own line, whatever ran before it.
_PROBE = """
import json, sys
from autotune.cli import app
for args in json.loads(sys.argv[1]):
    try:
        app(args, prog_name="autotune")
    except SystemExit as exit:
        code = exit.code
    else:
        code = 0
    heavy = sorted({"torch", "torchvision", "sklearn", "plotly"} & set(sys.modules))
    print(_SEPARATOR, flush=True)
    print(f"exit {code}; loaded {' '.join(heavy) or 'none'}", file=sys.stderr, flush=True)
""".replace("_SEPARATOR", repr("-- probe: next command --"))


def _probe(*commands: tuple[str, ...], cwd: Path) -> list[tuple[str, str]]:
    """Each of ``commands`` run in turn in one fresh interpreter: what it printed, and the
    line that says its exit code and the heavy packages loaded once it had run."""
    done = run_python(_PROBE, json.dumps(commands), cwd=cwd, timeout=120)
    outputs = done.stdout.split("-- probe: next command --\n")[: len(commands)]
    lasts = [line for line in done.stderr.splitlines() if line.startswith("exit ")]
    assert len(outputs) == len(lasts) == len(commands), done.stdout + done.stderr
    return list(zip(outputs, lasts, strict=True))


def test_commands_that_read_a_study_do_not_import_torch(seen, tmp_path: Path):
    """best, studies, export to YAML/JSON, dashboard, --help and --version read a study or print
    text: importing torch (seconds on a CPU machine) is for the commands that train, and plotly
    (which the CUDA images autotune meets may lack) is for ``report``. They run one after
    another in one interpreter (one start, not seven); each is checked once it has run."""
    _, url = seen
    expected = (
        (("--help",), "export"),
        (("--version",), __version__),
        (("best", "--study", "seen", "--storage", url), "Export it:"),
        (("best", "--study", "seen", "--storage", url, "--json"), '"config"'),
        (("studies", "--storage", url), "seen"),
        (("export", "--study", "seen", "--storage", url, "--format", "yaml"), "config:"),
        (("export", "--study", "seen", "--storage", url, "--format", "json"), '"config"'),
    )
    probed = _probe(*(args for args, _ in expected), cwd=tmp_path)
    for (args, shown), (stdout, last) in zip(expected, probed, strict=True):
        assert shown in stdout, (args, stdout)
        assert last == "exit 0; loaded none", (args, last)
    # the dashboard: every import done, then the port it is given is taken
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        ((shown, last),) = _probe(("dashboard", "--storage", url, "--port", port), cwd=tmp_path)
    # optuna-dashboard imports scikit-learn (for its importances): torch it need not
    assert last.startswith("exit 1; loaded ") and "torch" not in last, last
    assert "http://" not in shown, shown  # a URL that serves nothing is not said


def test_run_takes_autotune_storage_unless_the_space_file_names_one(tmp_path: Path, monkeypatch):
    from autotune.session import RunOptions, load_run_spec
    from autotune.spacefile import DEFAULT_STORAGE, parse_spec

    monkeypatch.setenv("AUTOTUNE_STORAGE", "sqlite:////elsewhere/a.db")
    plain = parse_spec("workload: {model: digits_cnn, data: digits}\n")
    assert load_run_spec(plain).study.storage == "sqlite:////elsewhere/a.db"
    named = parse_spec(
        "study: {storage: 'sqlite:///mine.db'}\nworkload: {model: digits_cnn, data: digits}\n"
    )
    assert load_run_spec(named).study.storage == "sqlite:///mine.db"
    given = load_run_spec(named, RunOptions(storage="sqlite:///given.db"))
    assert given.study.storage == "sqlite:///given.db"
    monkeypatch.delenv("AUTOTUNE_STORAGE")
    assert load_run_spec(plain).study.storage == DEFAULT_STORAGE


def test_best_says_what_its_seconds_are_and_no_speedup_the_run_did_not(
    invoke_cli, seen, tmp_path: Path
):
    """``best`` states the speed-up ``run`` stated, from the confirmation round, and none
    where the run stated none: it once said "4.71x ... one measurement each" from the trials'
    values where the round measured the untuned baseline infeasible."""
    from autotune import export

    study, url = seen
    baseline = next(t for t in study.get_trials() if t.user_attrs.get("baseline"))
    trial = next(t for t in study.get_trials() if t.number != baseline.number and t.value)
    shown = invoke_cli(
        "best", "--study", "seen", "--storage", url, "--trial", str(trial.number),
        cwd=tmp_path, columns=80,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = [line.strip() for line in shown.stdout.splitlines()]
    assert any(line.startswith("train_seconds:") and "overhead_seconds included" in line
               for line in lines), lines  # fmt: skip
    said = " ".join(shown.stdout.split())
    assert export.best_config(study, trial).confirmation_text(url) in said  # the round's words
    assert "one measurement each" not in said
    assert f"of the untuned baseline (trial {baseline.number})" not in said
    assert f"autotune export --study seen --storage {url} --trial {trial.number} -o train.py" in (
        lines
    )  # whole, and the trial shown: not the answer


def test_best_of_a_trial_the_round_did_not_rank_says_its_value_is_one_measurement(
    invoke_cli, tmp_path: Path
):
    """``best --trial N`` of a trial outside the round said "not confirmed: the round ranked
    only its leaders ..." and never what its figure rests on; the answer's says "median of 3
    confirmed runs"."""
    space = write_space(tmp_path, n_trials=4)
    space.write_text(space.read_text().replace("  seed: 0\n", SMALL_ROUNDS))
    done = invoke_cli("run", str(space), "--isolation", "none", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    study = load_study("tiny", f"sqlite:///{tmp_path}/studies/autotune.db")
    answer = studies.answer_of(study)
    assert answer is not None and answer.confirmed
    outside = [
        t.number
        for t in study.get_trials()
        if t.state == TrialState.COMPLETE and answer.configuration(t.number) is None
    ]
    assert outside, "the round ran every trial"
    shown = invoke_cli("best", "--trial", str(outside[0]), cwd=tmp_path, columns=200)
    assert shown.returncode == 0, shown.stderr
    facts = [line.strip() for line in shown.stdout.splitlines()[1:4]]
    assert facts[:2] == [
        "not confirmed: the round ranked only its leaders that met the bar in most of their "
        "runs, with 2 runs compared at least",
        "its value is one measurement, its trial's; the confirmation round did not run it",
    ], shown.stdout
    # the answer's own: the round's runs, and no such line
    answer_shown = invoke_cli("best", "--trial", str(answer.number), cwd=tmp_path, columns=200)
    assert f"(median of {answer.runs} confirmed runs)" in answer_shown.stdout
    # the figures beside the median: the round's, and the trial's own said to be its own
    assert answer.winner is not None
    medians = f"validation accuracy {display.fmt(answer.winner.median_score)}"
    assert f"the round's medians: {medians}, " in answer_shown.stdout
    assert f"the figures below are trial {answer.number}'s own measurement" in answer_shown.stdout
    assert "(the seconds its trial's value is based on)" in answer_shown.stdout
    assert "one measurement" not in answer_shown.stdout


def test_best_of_an_infeasible_trial_says_so_and_its_export_command_names_it(
    invoke_cli, seen, tmp_path: Path
):
    """``best --trial 9`` of a trial below min_accuracy printed its value and "Export it:
    autotune export --study quickstart -o train.py", which exports another trial: it warns as
    ``export --trial 9`` does, and its command names the trial."""
    study, url = seen
    copy = f"sqlite:///{tmp_path / 'copy.db'}"
    optuna.copy_study(from_study_name="seen", from_storage=url, to_storage=copy)
    chosen = next(t for t in study.get_trials() if t.state == TrialState.COMPLETE)
    why = "accuracy 0.8972 is below min_accuracy 0.9"
    with sqlite3.connect(tmp_path / "copy.db") as connection:  # as the trial would record it
        (trial_id,) = connection.execute(
            "SELECT trial_id FROM trials WHERE number = ?", (chosen.number,)
        ).fetchone()
        for table, key, value in (
            ("trial_system_attributes", "constraints:min_accuracy", 0.0028),
            ("trial_user_attributes", "infeasible_reason", why),
        ):
            connection.execute(
                f"INSERT OR REPLACE INTO {table} (trial_id, key, value_json) VALUES (?, ?, ?)",
                (trial_id, key, json.dumps(value)),
            )
    where = ("--study", "seen", "--storage", copy, "--trial", str(chosen.number))
    warning = f"trial {chosen.number} is infeasible ({why}): it is not the study's answer"
    shown = invoke_cli("best", *where, cwd=tmp_path, columns=200)
    assert shown.returncode == 0, shown.stderr
    assert f"warning: {warning}" in shown.stdout
    assert (
        f"autotune export --study seen --storage {copy} --trial {chosen.number} -o train.py"
        in (shown.stdout)
    )
    exported = invoke_cli("export", *where, "-o", "t.py", cwd=tmp_path, columns=200)
    assert exported.returncode == 0, exported.stderr
    assert f"warning: {warning}, and the export says so" in exported.stdout


def test_a_command_that_trains_a_stored_study_names_its_storage_in_the_commands_it_suggests(
    seen,
):
    """``confirm --storage URL`` of a study whose space file names no storage suggested
    ``autotune confirm --study NAME --repeats 3``: the default storage, another study."""
    from autotune.cli._confirm import open_to_train

    study, url = seen
    from autotune.export import study_spec

    stored = study_spec(study)
    assert stored is not None and stored.study.storage != url  # the space file names none
    found, spec, executor = open_to_train("seen", url, "none")
    executor.close()
    assert found.study_name == "seen" and spec.study.storage == url


def test_a_run_whose_trials_all_failed_exits_1_saying_why(invoke_cli, tmp_path: Path):
    """One rule for the exit status: a run after which no trial of the study trained to its
    end fails, whatever its trials' messages, with a line naming the commonest (here a NaN
    loss in every trial, each with its own learning rate in the message)."""
    text = TINY_SPACE.format(n_trials=2, pruner="none").replace(
        "model: autotune.testing:tiny_mlp",
        "model: autotune.testing:tiny_mlp\n  model_args: {nan_after_steps: 2}",
    )
    space = write_space(tmp_path, text)
    done = invoke_cli("run", str(space), "--isolation", "none", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert said.startswith("error: no trial of the study trained to its end; ")
    assert "of its trials: training loss is nan" in said
    assert "Traceback" not in done.stdout + done.stderr


WORKER_ONLY_FAILURE = """\
import multiprocessing

from autotune.testing import blobs


def data(**kwargs):  # loads in the study process, not in its worker
    if multiprocessing.current_process().name == "autotune-worker":
        raise RuntimeError("the data set is not mounted on this node")
    return blobs(**kwargs)
"""


def test_an_error_during_the_live_display_gets_a_line_of_its_own(
    invoke_cli, tmp_path: Path, user_module
):
    """The worker cannot load the data (its node lacks the mount): one error line, after the
    live display's last line has ended (piped, it has no cursor to end it)."""
    user_module("mounted", WORKER_ONLY_FAILURE)
    text = TINY_SPACE.format(n_trials=2, pruner="none")
    text = text.replace("data: autotune.testing:blobs", "data: mounted:data")
    space = write_space(tmp_path, text.replace("  seed: 0\n", "  seed: 0\n  strategy: joint\n"))
    done = invoke_cli("run", str(space), cwd=tmp_path)  # its worker: a process of its own
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the data set is not mounted on this node" in done.stderr
    assert done.stdout.endswith("\n"), done.stdout[-200:]
    assert "Traceback" not in done.stdout + done.stderr


BAD_MODEL = """\
import torch
from torch import nn


class Bad(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.layer = nn.Linear(3, num_classes)

    def forward(self, x):  # fine on the check's two samples, not on a trial's batches
        if x.shape[0] > 2:
            raise ValueError("shapes do not match")
        return self.layer(x[:, :3])


def bad(num_classes):
    return Bad(num_classes)
"""


def test_a_bug_that_fails_stage_one_names_the_users_file_and_keeps_its_traceback(
    invoke_cli, tmp_path: Path, user_module
):
    user_module("bad_model", BAD_MODEL)
    text = TINY_SPACE.format(n_trials=2, pruner="none").replace(
        "autotune.testing:tiny_mlp", "bad_model:bad"
    )
    space = write_space(tmp_path, text)
    done = invoke_cli("run", str(space), cwd=tmp_path, columns=80)  # stage 1 in its worker
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert "every trial failed with the same error: ValueError: shapes do not match" in said
    assert "(at bad_model.py:12 in forward)" in said  # the user's own line, in the one line
    assert "fail_traceback attribute of the failed trials of study tiny.speed" in said
    assert "trials this run" not in done.stdout  # none ran: the error line says why
    speed = optuna.load_study(
        study_name="tiny.speed", storage=f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    )
    kept = [t.user_attrs.get("fail_traceback") for t in speed.trials]
    assert kept and all(text and 'bad_model.py", line 12' in text for text in kept)
    # the traceback shown, from stage 1 run in this process (no worker) the second time
    verbose = invoke_cli("run", str(space), "--verbose", "--isolation", "none", cwd=tmp_path)
    assert verbose.returncode == 1
    assert 'bad_model.py", line 12, in forward' in verbose.stdout  # the traceback, shown


def test_a_round_led_by_a_reference_is_announced_without_a_zero_best(monkeypatch, capsys):
    """The best trial of a tiny study was the tuning checklist: the round said "Confirming the
    0 best, the untuned baseline and the tuning checklist"."""
    from autotune import session
    from autotune.cli._confirm import confirm_round
    from autotune.spacefile import parse_spec

    def answer(inputs: studies.ConfirmationInputs, on_other: object = None) -> bool:
        assert inputs.on_start is not None
        inputs.on_start(studies.ConfirmationRecord(1, 1, True, (1, 0), 0, checklist=1))
        return True

    monkeypatch.setattr(session, "confirm_answer", answer)
    spec = parse_spec(TINY_SPACE.format(n_trials=2, pruner="none"))
    assert confirm_round(None, spec, None, 1, 1)
    said = " ".join(capsys.readouterr().out.split())
    assert "Confirming the untuned baseline and the tuning checklist: 2 runs" in said, said
    # one searched leader beside a checklist that leads: "the best configuration" read as if
    # the searched one were the best
    inputs_record = studies.ConfirmationRecord(1, 1, True, (1, 2, 0), 0, checklist=1)
    monkeypatch.setattr(
        session, "confirm_answer", lambda inputs, on_other=None: inputs.on_start(inputs_record)
    )
    confirm_round(None, spec, None, 2, 1)
    said = " ".join(capsys.readouterr().out.split())
    assert "Confirming the best searched configuration, the untuned baseline and" in said, said


def _ctrl_c_at(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, when: Any) -> None:
    """A real Ctrl-C (SIGINT to this process) the first time ``owner.name`` is called with
    arguments for which ``when`` holds, as if the user pressed it there."""
    import signal

    called = getattr(owner, name)
    pressed: list[bool] = []

    def pressing(*args: Any, **kwargs: Any) -> Any:
        if not pressed and when(*args, **kwargs):
            pressed.append(True)
            signal.raise_signal(signal.SIGINT)
        return called(*args, **kwargs)

    monkeypatch.setattr(owner, name, pressing)


RESUME_LINE = "; run the same command to resume."


def test_a_run_stopped_in_stage_1_says_how_to_resume_and_nothing_of_trials(
    invoke_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Ctrl-C in stage 1, before any trial: the run said "0 trials this run; the study has
    none." and "No trial has completed feasibly yet (none reached accuracy 0.5)." of trials
    that never ran. It says what is kept and how to resume, and that only."""
    from autotune.display._live import LiveObserver

    space = write_space(tmp_path, n_trials=2)
    _ctrl_c_at(monkeypatch, LiveObserver, "speed_measured", lambda *args: True)
    done = invoke_cli("run", str(space), "--isolation", "none", cwd=tmp_path)
    assert done.returncode == 130, done.stdout + done.stderr
    after_bar = done.stdout.split(" 0/2 best: -")[1].split("\n", 1)[1]  # the live display's
    assert " ".join(after_bar.split()) == (
        "Interrupted. Stage 1's finished measurements are saved and will be reused" + RESUME_LINE
    ), done.stdout


def test_a_run_stopped_in_its_trials_leads_with_how_to_resume_even_when_stopped_again(
    invoke_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Ctrl-C in the trials of a study short of its total: the resume line came last, after
    the best trial's 23 lines and "Confirm it: autotune confirm ..." (the resumed run finishes
    the study and confirms it); a second Ctrl-C during that summary lost the resume line. It
    leads now, and the best trial is the best so far, with no advice to confirm it."""
    from autotune.display._live import LiveObserver

    space = write_space(tmp_path, n_trials=6)
    space.write_text(space.read_text().replace("  seed: 0\n", SMALL_ROUNDS))
    finished = lambda self, trial: trial.state == TrialState.COMPLETE  # noqa: E731
    _ctrl_c_at(monkeypatch, LiveObserver, "trial_finished", finished)
    done = invoke_cli("run", str(space), "--isolation", "none", cwd=tmp_path)
    assert done.returncode == 130, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    stopped = "Interrupted. The running trial (or confirmation run) is recorded as interrupted"
    assert stopped in said and RESUME_LINE in said, said
    assert said.index(RESUME_LINE) < said.index("trials this run"), said
    assert "Best configuration so far (trial" in said and "autotune confirm" not in said, said
    # resumed, stopped again in its trials, and once more as it sums up: the line stays
    _ctrl_c_at(monkeypatch, LiveObserver, "trial_finished", finished)
    _ctrl_c_at(monkeypatch, display, "print_summary", lambda *args, **kwargs: True)
    again = invoke_cli("run", str(space), "--isolation", "none", cwd=tmp_path)
    assert again.returncode == 130, again.stdout + again.stderr
    assert RESUME_LINE in " ".join(again.stdout.split()), again.stdout
    assert "trials this run" not in again.stdout  # the second Ctrl-C stopped the summary


def test_a_ctrl_c_that_escapes_the_run_as_it_winds_down_still_says_how_to_resume(
    invoke_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A Ctrl-C outside the trials' own handling (the second of two, as the run stops for the
    first, or one as its live display closes) ended the command with 130 and no line."""
    from autotune.cli._run import Shown

    space = write_space(tmp_path, n_trials=2)
    _ctrl_c_at(monkeypatch, Shown, "trials_done", lambda *args: True)
    done = invoke_cli("run", str(space), "--isolation", "none", cwd=tmp_path)
    assert done.returncode == 130, done.stdout + done.stderr
    assert " ".join(done.stdout.split()).endswith(RESUME_LINE), done.stdout


def test_an_interrupted_confirm_again_says_the_command_that_resumes_it(tmp_path: Path, capsys):
    """``confirm --again`` stores its new round as it starts: run again with --again it would
    start over, so its Ctrl-C line names the command without it; a plain confirm's, itself."""
    import typer

    from autotune.cli import _confirm

    class Executor:  # what ``training`` closes, however the runs end
        closed = False

        def close(self) -> None:
            self.closed = True

    storage = f"sqlite:///{tmp_path / 'a.db'}"
    for resume, said in (
        ("run the same command without --again", "without --again to resume."),
        ("run the same command", "run the same command to resume."),
    ):
        executor = Executor()
        with pytest.raises(typer.Exit) as ended, _confirm.training(executor, storage, resume):
            raise KeyboardInterrupt
        assert ended.value.exit_code == 130 and executor.closed
        line = " ".join(capsys.readouterr().out.split())
        assert line.startswith("Interrupted. The finished runs are saved;") and line.endswith(said)
