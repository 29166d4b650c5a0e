"""How a study samples and prunes: a per-trial seeded sampler (kept to what stage 1 found can
run), and the pruners."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial, TrialState

from autotune.spacefile import Spec

# draws of the inner sampler's joint proposal before the knobs stage 1 decides are drawn one
# by one instead (each kept to what can run)
REDRAWS = 20


class TrialSeededSampler(optuna.samplers.BaseSampler):
    """A sampler made afresh for each trial, seeded from the study's seed and the trial's number.

    The storage hands every trial a number of its own, so processes that share a study draw
    different configurations even when they start together, while one process re-running a
    seeded study draws the same ones, resumed runs included. TPE and random sampling keep no
    state between trials but their random generator (TPE reads the history from the storage
    every time), so a new instance per trial changes nothing else.
    """

    def __init__(
        self, make: Callable[[int], optuna.samplers.BaseSampler], seed: int, startup: int = 0
    ) -> None:
        self._make, self._seed = make, seed
        self._startup = startup  # the first trials, spread over the space (see spread_value)
        self._number: int | None = None
        self._inner = make(seed)
        self._runnable: tuple[dict[str, Any], ...] = ()  # nothing ruled out (keep_to)
        self._decided: frozenset[str] = frozenset()  # the parameters those points name

    def keep_to(self, runnable: Sequence[dict[str, Any]]) -> None:
        """Draw only parameters that match one of ``runnable`` (stage 1's splits that can
        train: ``space.runnable_points``) on the parameters those name. The distributions stay
        the study's (Optuna refuses a categorical whose choices change within a study, and the
        trials already stored were drawn from them): what stage 1 ruled out is given no chance,
        so no trial of the budget is spent on it. Empty: nothing ruled out."""
        self._runnable = tuple(runnable)
        self._decided = frozenset(name for point in self._runnable for name in point)

    def _can_run(self, params: dict[str, Any]) -> bool:
        """Whether some runnable point agrees with ``params`` on every parameter it names."""
        if not self._runnable:
            return True
        named = {k: v for k, v in params.items() if k in self._decided}
        return any(all(point.get(k, v) == v for k, v in named.items()) for point in self._runnable)

    def _for(self, trial: FrozenTrial) -> optuna.samplers.BaseSampler:
        if trial.number != self._number:
            # the study seed spaced far apart, so seeds s and s + 1 share no trial's draw
            seed = (self._seed * 1_000_003 + trial.number) % 2**32
            self._inner, self._number = self._make(seed), trial.number
        return self._inner

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._for(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        """The inner sampler's joint proposal, drawn again where stage 1 found it cannot run;
        after ``REDRAWS`` such, without the parameters stage 1 decides (drawn one by one)."""
        for _ in range(REDRAWS):
            drawn = self._for(trial).sample_relative(study, trial, search_space)
            if self._can_run(drawn):
                return drawn
        return {name: value for name, value in drawn.items() if name not in self._decided}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        finished = study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)
        )
        kept = self._kept(trial, param_name, param_distribution)
        if len(finished) < self._startup:  # as TPE counts its startup trials
            return spread_value(self._seed, self._startup, trial.number, param_name, kept)
        if param_name not in self._decided:
            return self._for(trial).sample_independent(study, trial, param_name, kept)
        for _ in range(REDRAWS):  # the inner sampler's model knows the study's distribution
            value = self._for(trial).sample_independent(
                study, trial, param_name, param_distribution
            )
            if self._can_run({**trial.params, param_name: value}):
                return value
        return spread_value(self._seed, max(self._startup, 1), trial.number, param_name, kept)

    def _kept(
        self, trial: FrozenTrial, name: str, distribution: BaseDistribution
    ) -> BaseDistribution:
        """``distribution`` without the choices that cannot run given ``trial``'s parameters so
        far (unchanged where none or all of them can: NothingFits refuses such a trial)."""
        if not isinstance(distribution, CategoricalDistribution) or name not in self._decided:
            return distribution
        kept = [c for c in distribution.choices if self._can_run({**trial.params, name: c})]
        return CategoricalDistribution(kept) if kept else distribution

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._for(trial).before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._for(trial).after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()


def spread_value(
    seed: int, strata: int, number: int, name: str, distribution: BaseDistribution
) -> Any:
    """Trial ``number``'s value of knob ``name`` in a Latin hypercube over ``strata`` trials:
    the knob's range (its log where it is searched on one) cut into ``strata`` equal parts, and
    consecutive trials in different parts (a permutation seeded by the study's seed and the
    knob), each at a seeded place within its part. Independent draws put the first trials next
    to each other, or next to the untuned baseline, by chance; these cover every knob's range."""
    part = random.Random(f"{seed}:{name}").sample(range(strata), strata)[number % strata]
    share = (part + random.Random(f"{seed}:{name}:{number}").random()) / strata  # in [0, 1)
    if isinstance(distribution, CategoricalDistribution):
        return distribution.choices[int(share * len(distribution.choices))]
    assert isinstance(distribution, FloatDistribution | IntDistribution), distribution
    low, high = distribution.low, distribution.high
    if distribution.log:
        value = math.exp(math.log(low) + share * (math.log(high) - math.log(low)))
    else:
        value = low + share * (high - low)
    if distribution.step is not None:  # an int's step is 1
        value = low + round((value - low) / distribution.step) * distribution.step
    value = min(max(value, low), high)
    return round(value) if isinstance(distribution, IntDistribution) else float(value)


def make_sampler(spec: Spec) -> optuna.samplers.BaseSampler:
    """The study's sampler (seeded TPE or random), seeded per trial: see TrialSeededSampler."""
    if spec.study.sampler == "random":
        return TrialSeededSampler(
            lambda seed: optuna.samplers.RandomSampler(seed=seed), spec.study.seed
        )

    def tpe(seed: int) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():
            # group and constant_liar are experimental
            warnings.simplefilter("ignore", ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed,
                multivariate=True,
                group=True,  # conditional knobs (prefetch_factor, momentum) form their own groups
                constant_liar=True,  # trials running in other processes count as poor ones
                n_startup_trials=spec.study.n_startup_trials,  # counted over the whole study
            )

    return TrialSeededSampler(tpe, spec.study.seed, startup=spec.study.n_startup_trials)


def make_pruner(spec: Spec) -> optuna.pruners.BasePruner:
    """The study's pruner; evaluations are the steps it compares trials at."""
    name = spec.study.pruner
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1)
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1)
    return optuna.pruners.NopPruner()
