"""What does it cost each search strategy to find a configuration within 5% of the best?

Compares ``two_stage`` (stage 1 times the execution knobs, stage 2 trains only what changes
learning), ``joint`` (one TPE + Hyperband study over every knob) and random search (every knob,
no pruning) by the wall-clock seconds each spends until the configuration it would answer with
is within 5% of the best one known, median over seeds. Running every strategy for real many
times is slow and noisy, so, as tabular HPO benchmarks do, the script records a grid once and
replays the strategies against it:

``record`` trains every configuration of the space file once, to its end: the learning rate
at ``--lrs`` log-spaced values over its range, times every batch size, accumulation, precision
and execution setting (``SpeedPlan.all_settings``) the machine can run. Per configuration it
keeps each evaluation (epoch, accuracy, training and evaluation seconds, the value the pruner
sees), samples/s, one-time overhead, the wall seconds of the whole run and the objective's
value and feasibility; faults are kept as failed points. It also runs the real stage 1
(``run_speed_stage``, rematches included) once, keeping every measurement, its cost, the stage's
wall seconds and its ``SpeedTable``. Configurations are trained in a shuffled order, so that
drift in the machine's speed does not line up with any knob.

    python benchmarks/search_efficiency.py record search_spaces/quickstart.yaml \\
        --out /tmp/grid.json --lrs 4

``replay`` runs, for each seed, an in-memory Optuna study per strategy with the study's own
sampler and pruner (``make_sampler``, ``make_pruner``: seeded TPE with ``n_startup_trials``,
Hyperband from ``min_resource=1``) and the study's own sampling code (``space.sample``, with the
learning rate a categorical over the recorded values so that every draw is a grid point). A
trial reports the recorded values at each evaluation and stops where the pruner says; it costs
its point's wall seconds outside training and evaluation (set-up, paid by every trial) plus the
training and evaluation seconds up to where it stopped. ``two_stage`` pays stage 1's recorded
wall seconds first and draws only lr, effective batch and precision, the split and execution
settings coming from the recorded ``SpeedTable.fastest``. The incumbent after each trial is the
best feasible value seen (the value the replay sees *is* the grid's, one measurement per
point); "reached" once it is within 5% of the grid's best feasible value.

    python benchmarks/search_efficiency.py replay /tmp/grid.json --seeds 10

A trial also stops where it cannot win (``objective.cannot_win``, against the best feasible
value seen so far), as the study stops it under any pruner; two more rows replay two_stage and
joint without that stop, to show what it saves.

Printed: per strategy the seeds that reached it within the budget (default: the space's
``n_trials``), the median cost to reach it in seconds and as a fraction of the grid's cost (the
wall seconds of every grid point), and the ratio joint / two_stage; then the pruning fidelity
of stage 2: the Spearman correlation, over the configurations stage 2 can draw, of the value
at the first evaluation with the final value. Paste the tables into BENCHMARKS.md. Goals on the
quickstart: two_stage within 5% of the grid's best at no more than 15% of the grid's cost, at
least 3x cheaper than joint to get there; pruning fidelity at least 0.7.

Departures from the issue's sketch: costs are wall seconds, not training seconds alone (a
trial's set-up and evaluations are paid whether it is pruned or not, and stage 1 is all
wall-clock); stage 1 is the real one, run once, not a re-derivation; the untuned baseline trial
(trial 0 of a real study, in both strategies) is left out of every strategy alike.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from _stats import spearman  # benchmarks/_stats.py, beside this script
from optuna.trial import TrialState

from autotune.config import TrialConfig, scaled_lr
from autotune.executor import InProcessExecutor
from autotune.faults import TrialFault, classify
from autotune.knobs import SPEED_KNOBS
from autotune.machine.hardware import Hardware, detect
from autotune.results import Evaluation
from autotune.search import objective, space
from autotune.search.references import untuned_config
from autotune.spacefile import Choice, FloatRange, Spec, load_spec
from autotune.speed import BurstPlan, SpeedMeasurement, SpeedTable
from autotune.stage1._plan import SpeedPlan, describe
from autotune.stage1._stage import run_speed_stage
from autotune.stage1._take import StageInputs
from autotune.study._sampling import make_pruner, make_sampler
from autotune.testing import never_stop
from autotune.training.telemetry import fingerprint
from autotune.workloads import load

STRATEGIES = ("two_stage", "joint", "random")
WITHIN = 0.05  # "reached": the incumbent's value within this of the grid's best
GOAL_GRID_SHARE = 0.15  # two_stage reaches it at no more than this share of the grid's cost
GOAL_RATIO = 3.0  # ... and at least this many times cheaper than joint
GOAL_FIDELITY = 0.7  # Spearman of first-evaluation and final values over stage 2's space
SHUFFLE_SEED = 12345  # the order grid points are trained in
GRID_VERSION = 1

Key = tuple[Any, ...]  # (base_lr, batch_size, accumulation_steps, precision, settings values)


# -- shared ------------------------------------------------------------------------------------


def restricted_spec(path: Path) -> tuple[Spec, Hardware, Any]:
    """The space file's spec restricted to this machine, its hardware and workload."""
    spec = load_spec(path)
    hardware = detect(spec.workload.device)
    workload = load(spec.workload, path.parent, spec.objective.score)
    return space.restrict(spec, hardware, workload).spec, hardware, workload


def with_lrs(spec: Spec, lrs: list[float]) -> Spec:
    """``spec`` with the learning rate a choice among ``lrs``: every draw is a grid point."""
    lr = Choice(values=tuple(lrs))
    return spec.model_copy(update={"space": spec.space.model_copy(update={"lr": lr})})


def config_key(config: TrialConfig) -> Key:
    """What identifies a grid point: the knobs the grid varies."""
    settings = tuple(getattr(config, name) for name in SPEED_KNOBS)
    return (
        config.base_lr,
        config.batch_size,
        config.accumulation_steps,
        config.precision,
        settings,
    )


def log_spaced(low: float, high: float, count: int) -> list[float]:
    """``count`` values from ``low`` to ``high``, evenly spaced in log."""
    if count == 1:
        return [math.sqrt(low * high)]
    step = math.log(high / low) / (count - 1)
    return [float(f"{low * math.exp(i * step):.6g}") for i in range(count)]


# -- record ------------------------------------------------------------------------------------


class TimedExecutor:
    """An in-process executor that keeps every stage 1 measurement and what it cost."""

    def __init__(self, inner: InProcessExecutor) -> None:
        self.inner = inner
        self.accumulations: tuple[int, ...] = ()
        self.measurements: list[dict[str, Any]] = []

    def train(self, config: TrialConfig, report: Any) -> Any:
        return self.inner.train(config, report)

    def measure(self, config: TrialConfig, plan: BurstPlan) -> SpeedMeasurement:
        settings = tuple((name, getattr(config, name)) for name in SPEED_KNOBS)
        entry: dict[str, Any] = {
            "batch_size": config.batch_size,
            "precision": config.precision,
            "settings": settings,
            "words": describe(settings),
        }
        started = time.monotonic()
        try:
            result = self.inner.measure(config, plan)
        except Exception as error:
            entry["cost_seconds"] = time.monotonic() - started
            entry["fault"] = classify(error)[1]
            self.measurements.append(entry)
            raise
        entry["cost_seconds"] = time.monotonic() - started
        entry["samples_per_second_by_accumulation"] = {
            str(a): result.samples_per_second(a) for a in self.accumulations
        }
        entry["one_time_seconds"] = result.one_time_seconds
        self.measurements.append(entry)
        return result

    def close(self) -> None:
        self.inner.close()


def record_stage_one(
    spec: Spec, hardware: Hardware, workload: Any, accumulations: tuple[int, ...]
) -> dict[str, Any]:
    """Run the real stage 1 once in an in-memory study; its measurements, cost and table."""
    executor = TimedExecutor(InProcessExecutor(workload))
    executor.accumulations = accumulations
    study = optuna.create_study(
        study_name="search-efficiency",
        storage=optuna.storages.InMemoryStorage(),
        direction="maximize",
    )
    started = time.monotonic()
    table = run_speed_stage(StageInputs(study, spec, hardware, executor, workload), remeasure=True)
    seconds = time.monotonic() - started
    for m in executor.measurements:
        speed = m.get("samples_per_second_by_accumulation", {}).get("1")
        shown = f"{speed:,.0f} samples/s" if speed else f"failed: {m['fault']}"
        print(
            f"  stage 1: batch {m['batch_size']}, {m['precision']}, {m['words']}: {shown} "
            f"({m['cost_seconds']:.1f} s)"
        )
    return {
        "wall_seconds": seconds,
        "measurements": executor.measurements,
        **table.to_attrs(),
    }


def grid_configs(spec: Spec, hardware: Hardware, lrs: list[float]) -> list[TrialConfig]:
    """Every grid point: lr x batch size x accumulation x precision x execution settings."""
    base = untuned_config(spec, hardware)
    plan = SpeedPlan(spec, base)
    configs = []
    for lr in lrs:
        for cell in plan.cells():
            for accumulation in plan.accumulations:
                for settings in plan.all_settings(cell):
                    effective = cell.batch_size * accumulation
                    configs.append(
                        base.replace(
                            base_lr=lr,
                            lr=scaled_lr(lr, effective, base.base_batch_size, base.lr_scaling),
                            batch_size=cell.batch_size,
                            accumulation_steps=accumulation,
                            precision=cell.precision,
                            seed=spec.study.seed,
                            **dict(settings),
                        )
                    )
    return configs


def train_point(executor: InProcessExecutor, config: TrialConfig, spec: Spec) -> dict[str, Any]:
    """Train one grid point to its end; what the replay needs of it."""
    point: dict[str, Any] = {
        "lr": config.base_lr,
        "batch_size": config.batch_size,
        "accumulation_steps": config.accumulation_steps,
        "precision": config.precision,
        "settings": [[name, getattr(config, name)] for name in SPEED_KNOBS],
    }
    started = time.monotonic()
    try:
        result = executor.train(config, never_stop)
    except Exception as error:
        kind, message = classify(error)
        if isinstance(error, TrialFault):
            kind, message = error.kind, str(error)
        point.update(wall_seconds=time.monotonic() - started, fault=f"{kind}: {message}")
        return point
    score = objective.score(result, spec.objective)
    point.update(
        wall_seconds=time.monotonic() - started,
        fault=None,
        evaluations=[
            {
                "index": e.index,
                "epoch": e.epoch,
                "accuracy": e.score,  # the score (accuracy on the quickstart)
                "train_seconds": e.train_seconds,
                "overhead_seconds": e.overhead_seconds,
                "eval_seconds": e.eval_seconds,
                "final": e.final,
                "value": objective.intermediate_value(e, spec.objective),
            }
            for e in result.evaluations
        ],
        accuracy=result.score,
        train_seconds=result.train_seconds,
        overhead_seconds=result.overhead_seconds,
        samples_per_second=result.samples_per_second,
        value=score.value,
        constraint=score.constraint,
        feasible=score.feasible,
    )
    return point


def record(args: argparse.Namespace) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.monotonic()
    spec, hardware, workload = restricted_spec(args.space)
    lr = spec.space.lr
    assert isinstance(lr, FloatRange), "the learning rate must be a range"
    lrs = log_spaced(lr.low, lr.high, args.lrs)
    plan = SpeedPlan(spec, untuned_config(spec, hardware))
    print(f"{args.space}: stage 1 on {fingerprint(hardware)}", flush=True)
    stage_one = record_stage_one(spec, hardware, workload, plan.accumulations)
    print(f"stage 1: {stage_one['wall_seconds']:.1f} s", flush=True)
    configs = grid_configs(spec, hardware, lrs)
    random.Random(SHUFFLE_SEED).shuffle(configs)
    if args.limit:
        configs = configs[: args.limit]  # a smoke test: not a grid the replay can use
    executor = InProcessExecutor(workload)
    points = []
    grid_started = time.monotonic()
    for number, config in enumerate(configs, 1):
        point = train_point(executor, config, spec)
        points.append(point)
        elapsed = time.monotonic() - grid_started
        left = elapsed / number * (len(configs) - number)
        settings = tuple((name, getattr(config, name)) for name in SPEED_KNOBS)
        outcome = (
            f"failed: {point['fault']}"
            if point["fault"]
            else f"accuracy {point['accuracy']:.3f}, {point['samples_per_second']:,.0f} "
            f"samples/s, value {point['value']:.3f}{'' if point['feasible'] else ' (infeasible)'}"
        )
        print(
            f"[{number}/{len(configs)}] lr {config.base_lr:g}, batch {config.batch_size}x"
            f"{config.accumulation_steps}, {config.precision}, {describe(settings)}: {outcome}, "
            f"{point['wall_seconds']:.1f} s (about {left / 60:.1f} min left)",
            flush=True,
        )
    grid = {
        "version": GRID_VERSION,
        "space_file": str(args.space.resolve()),
        "space": str(spec.space),
        "machine": fingerprint(hardware),
        "lrs": lrs,
        "stage_one": stage_one,
        "points": points,
        "record_seconds": time.monotonic() - started,
    }
    args.out.write_text(json.dumps(grid, indent=1))
    print(f"{len(points)} points in {(time.monotonic() - started) / 60:.1f} min: {args.out}")


# -- replay ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One recorded grid point."""

    key: Key
    wall_seconds: float
    fault: str | None
    evaluations: tuple[dict[str, Any], ...]
    value: float | None
    constraint: float | None
    feasible: bool

    @classmethod
    def of(cls, data: dict[str, Any]) -> Point:
        settings = tuple(value for _, value in data["settings"])
        key = (
            data["lr"],
            data["batch_size"],
            data["accumulation_steps"],
            data["precision"],
            settings,
        )
        return cls(
            key=key,
            wall_seconds=data["wall_seconds"],
            fault=data["fault"],
            evaluations=tuple(data.get("evaluations", ())),
            value=data.get("value"),
            constraint=data.get("constraint"),
            feasible=bool(data.get("feasible", False)),
        )

    @property
    def setup_seconds(self) -> float:
        """Wall seconds outside training and evaluation: paid by every trial of it."""
        if not self.evaluations:
            return self.wall_seconds
        last = self.evaluations[-1]
        spent = last["train_seconds"] + sum(e["eval_seconds"] for e in self.evaluations)
        return max(0.0, self.wall_seconds - spent)

    def cost_seconds(self, evaluations: int) -> float:
        """Wall seconds of a trial of this point stopped after ``evaluations`` evaluations."""
        if not self.evaluations:
            return self.wall_seconds
        done = self.evaluations[:evaluations]
        return (
            self.setup_seconds + done[-1]["train_seconds"] + sum(e["eval_seconds"] for e in done)
        )


def speed_table(stage_one: dict[str, Any]) -> SpeedTable:
    """The recorded stage 1 table, as stage 2 reads it (recordings before the table had
    unrunnable rows have none)."""
    return SpeedTable.from_attrs({"unrunnable": [], **stage_one})


@dataclass(frozen=True)
class Run:
    """One strategy's replay with one seed."""

    reached_seconds: float | None  # cost until the incumbent was within WITHIN of the best
    reached_trials: int | None
    final_quality: float  # the incumbent's value at the end / the grid's best
    pruned: int
    spent_seconds: float


class Replay:
    """The recorded grid and the strategies replayed against it."""

    def __init__(self, grid: dict[str, Any]) -> None:
        spec, self.hardware, _ = restricted_spec(Path(grid["space_file"]))
        if str(spec.space) != grid["space"]:
            raise SystemExit(
                "the space file, restricted to this machine, is not the one recorded:\n"
                f"  now:      {spec.space}\n  recorded: {grid['space']}"
            )
        self.spec = with_lrs(spec, grid["lrs"])
        self.points = {p.key: p for p in map(Point.of, grid["points"])}
        self.table = speed_table(grid["stage_one"])
        self.stage_one_seconds: float = grid["stage_one"]["wall_seconds"]
        feasible = [p.value for p in self.points.values() if p.feasible and p.value is not None]
        self.best = max(feasible)
        self.grid_seconds = sum(p.wall_seconds for p in self.points.values())

    def two_stage_points(self) -> list[Point]:
        """The points stage 2 can draw: per lr, effective batch and precision, stage 1's."""
        found = []
        for lr in self.spec.space.lr.values:  # type: ignore[union-attr]  # a Choice here
            for effective in space.effective_batch_sizes(self.spec):
                for precision in dict.fromkeys(c.precision for c in self.table):
                    choice = self.table.fastest(effective, precision)
                    if choice is None:
                        continue
                    settings = dict(choice.settings)
                    key = (
                        lr,
                        choice.batch_size,
                        choice.accumulation_steps,
                        precision,
                        tuple(settings[name] for name in SPEED_KNOBS),
                    )
                    found.append(self.points[key])
        return found

    def run(self, strategy: str, seed: int, budget: int, cannot_win: bool = True) -> Run:
        """Replay ``strategy`` with ``seed`` for ``budget`` trials; ``cannot_win``: stop a
        trial that cannot win, as the study does with any pruner (``objective.cannot_win``)."""
        study_changes: dict[str, Any] = {"seed": seed}
        if strategy == "random":
            study_changes.update(sampler="random", pruner="none")
        spec = self.spec.with_overrides(study=study_changes)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(
                direction="maximize", sampler=make_sampler(spec), pruner=make_pruner(spec)
            )
        table = self.table if strategy == "two_stage" else None
        spent = self.stage_one_seconds if strategy == "two_stage" else 0.0
        incumbent: float | None = None
        reached_seconds: float | None = None
        reached_trials: int | None = None
        pruned = 0
        for number in range(1, budget + 1):
            trial = study.ask()
            try:
                config = (
                    space.sample(trial, spec, self.hardware)
                    if table is None
                    else space.draw_from_table(
                        space.suggestions(trial), spec, self.hardware, table, trial.number
                    )[0]
                )
            except space.NothingFits:
                trial.set_constraint("fault", 1.0)
                study.tell(trial, state=TrialState.PRUNED)
                continue
            point = self.points[config_key(config)]
            leader = incumbent if cannot_win and spec.study.pruner != "none" else None
            state, value, evaluations = self.trial(trial, point, spec, leader)
            spent += point.cost_seconds(evaluations)
            if state == TrialState.PRUNED:
                pruned += 1
                study.tell(trial, state=state)
            else:
                study.tell(trial, value)
                if point.feasible and value is not None:
                    incumbent = value if incumbent is None else max(incumbent, value)
            close = incumbent is not None and incumbent >= (1 - WITHIN) * self.best
            if close and reached_seconds is None:
                reached_seconds, reached_trials = spent, number
        return Run(
            reached_seconds=reached_seconds,
            reached_trials=reached_trials,
            final_quality=(incumbent or 0.0) / self.best,
            pruned=pruned,
            spent_seconds=spent,
        )

    def trial(
        self, trial: optuna.Trial, point: Point, spec: Spec, leader: float | None
    ) -> tuple[TrialState, float | None, int]:
        """Report ``point``'s recorded evaluations as the study's run loop would: the state
        the trial ends in, its value, and the evaluations it ran. With a ``leader`` (the best
        feasible value so far), a trial that cannot beat it stops as the study stops it."""
        if point.fault is not None:
            trial.set_constraint("fault", 1.0)
            return TrialState.PRUNED, None, 0
        for number, evaluation in enumerate(point.evaluations, 1):
            trial.report(evaluation["value"], evaluation["index"])
            if evaluation["final"]:
                continue
            if leader is not None:
                reachable = objective.best_reachable(
                    recorded(evaluation), spec.objective, spec.workload.epochs
                )
                if objective.cannot_win(reachable, leader, spec.objective):
                    return TrialState.PRUNED, None, number
            if trial.should_prune():
                return TrialState.PRUNED, None, number
        if point.constraint is not None:
            trial.set_constraint("min_accuracy", point.constraint)
        return TrialState.COMPLETE, point.value, len(point.evaluations)


def recorded(evaluation: dict[str, Any]) -> Evaluation:
    """A recorded evaluation as the study's objective reads one (what it does not read: 0)."""
    return Evaluation(
        index=evaluation["index"],
        epoch=evaluation["epoch"],
        optimizer_steps=0,
        samples_seen=0,
        score=evaluation["accuracy"],
        val_loss=None,
        train_loss=0.0,
        train_seconds=evaluation["train_seconds"],
        overhead_seconds=evaluation["overhead_seconds"],
        eval_seconds=evaluation["eval_seconds"],
        final=evaluation["final"],
    )


def fidelity(points: list[Point]) -> tuple[float, int]:
    """Spearman of the value at the first evaluation with the final value; points used."""
    trained = [p for p in points if p.fault is None and p.value is not None]
    first = [p.evaluations[0]["value"] for p in trained]
    final = [p.value for p in trained if p.value is not None]
    return spearman(first, final), len(trained)


def median_or_none(values: list[float | None]) -> float | None:
    """The median, counting None (never reached) as worse than any value; None if that."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    middle = ordered[(len(ordered) - 1) // 2 : len(ordered) // 2 + 1]
    if any(v is None for v in middle):
        return None
    return statistics.fmean(v for v in middle if v is not None)


def replay(args: argparse.Namespace) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    grid = json.loads(args.grid.read_text())
    replay = Replay(grid)
    budget = args.budget or replay.spec.study.n_trials
    points = list(replay.points.values())
    failed = sum(1 for p in points if p.fault is not None)
    feasible = sum(1 for p in points if p.feasible)
    stage_points = replay.two_stage_points()
    stage_best = max((p.value for p in stage_points if p.feasible and p.value), default=0.0)
    print(
        f"grid: {len(points)} points ({feasible} feasible, {failed} failed), lr {grid['lrs']}, "
        f"{replay.grid_seconds / 60:.1f} min of trials; best value {replay.best:.3f}; "
        f"stage 1: {len(grid['stage_one']['measurements'])} measurements, "
        f"{replay.stage_one_seconds:.1f} s ({replay.stage_one_seconds / replay.grid_seconds:.1%} "
        f"of the grid); best stage 2 can draw: {stage_best:.3f} "
        f"({stage_best / replay.best:.3f} of the best)"
    )
    print(f"machine: {grid['machine']}; budget {budget} trials, {args.seeds} seeds\n")
    runs: dict[str, list[Run]] = {}
    variants = [(strategy, strategy, True) for strategy in STRATEGIES] + [
        (f"{strategy}, no cannot-win stop", strategy, False) for strategy in STRATEGIES[:2]
    ]  # random search has no pruner, so no cannot-win stop either
    for label, strategy, cannot_win in variants:
        runs[label] = [
            replay.run(strategy, seed, budget, cannot_win)
            for seed in range(args.first_seed, args.first_seed + args.seeds)
        ]
    print(
        f"| strategy | reached within {WITHIN:.0%} (seeds) | median cost to reach (s) | "
        "share of the grid's cost | median trials to reach | median final / best | "
        "median pruned trials | median seconds spent |"
    )
    print("|---|---|---|---|---|---|---|---|")
    medians: dict[str, float | None] = {}
    for strategy, done in runs.items():
        cost = median_or_none([r.reached_seconds for r in done])
        trials = median_or_none(
            [None if r.reached_trials is None else r.reached_trials for r in done]
        )
        medians[strategy] = cost
        reached = sum(1 for r in done if r.reached_seconds is not None)
        shown = f"{cost / replay.grid_seconds:.1%}" if cost is not None else "not reached"
        print(
            f"| {strategy} | {reached} of {len(done)} | "
            f"{f'{cost:.1f}' if cost is not None else '-'} | {shown} | "
            f"{f'{trials:g}' if trials is not None else '-'} | "
            f"{statistics.median(r.final_quality for r in done):.3f} | "
            f"{statistics.median(r.pruned for r in done):g} | "
            f"{statistics.median(r.spent_seconds for r in done):.1f} |"
        )
    two, joint = medians["two_stage"], medians["joint"]
    ratio = joint / two if joint is not None and two is not None else None
    share = two / replay.grid_seconds if two is not None else None
    print(
        f"\njoint / two_stage (median cost to reach): "
        f"{f'{ratio:.2f}x' if ratio is not None else 'n/a (one of them did not reach it)'}"
    )
    print(
        f"goal: two_stage within {WITHIN:.0%} at <= {GOAL_GRID_SHARE:.0%} of the grid's cost: "
        f"{'met' if share is not None and share <= GOAL_GRID_SHARE else 'not met'}"
        f"{f' ({share:.1%})' if share is not None else ''}; "
        f">= {GOAL_RATIO:g}x cheaper than joint: "
        f"{'met' if ratio is not None and ratio >= GOAL_RATIO else 'not met'}"
    )
    rho, used = fidelity(stage_points)
    rho_all, used_all = fidelity(points)
    print(
        f"\npruning fidelity (Spearman, value at the first evaluation vs final): "
        f"{rho:.2f} over the {used} configurations stage 2 can draw "
        f"(goal >= {GOAL_FIDELITY:g}: {'met' if rho >= GOAL_FIDELITY else 'not met'}); "
        f"{rho_all:.2f} over all {used_all} grid points"
    )
    print(
        "\nwhat the replay cannot capture:\n"
        "- noise: each configuration is one measurement; a real study sees a fresh one per "
        "trial, and its answer is the best measured, not the best true value (the replay's "
        "incumbent is scored by the value it saw);\n"
        "- the grid is discrete: lr at the recorded values only, so TPE's density model and "
        "the distance to the true optimum differ from a continuous search;\n"
        "- stage 1 is one recorded run: its noise (which settings win close calls) is fixed "
        "across seeds, and the real stage reuses cached measurements on a second study;\n"
        "- interference, thermal and memory state, compile and worker warmth carried from one "
        "trial to the next, and worker-process isolation (the grid ran in one process);\n"
        "- the untuned baseline trial and the confirmation round of a real study, and "
        "trial timeouts, are left out."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="train every grid point once; write the grid")
    rec.add_argument("space", type=Path)
    rec.add_argument("--out", type=Path, required=True, help="the grid's JSON file")
    rec.add_argument("--lrs", type=int, default=4, help="log-spaced learning rates")
    rec.add_argument("--limit", type=int, default=0, help="train only this many (a smoke test)")
    rep = commands.add_parser("replay", help="replay the strategies against a recorded grid")
    rep.add_argument("grid", type=Path)
    rep.add_argument("--seeds", type=int, default=10)
    rep.add_argument("--first-seed", type=int, default=0)
    rep.add_argument("--budget", type=int, default=None, help="trials (default: n_trials)")
    args = parser.parse_args()
    if args.command == "record":
        record(args)
    else:
        replay(args)


if __name__ == "__main__":
    main()
