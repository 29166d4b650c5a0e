"""The confirmation round as people see it: its verdict on one trial, as the Python API and the
exports carry it (``BestConfig.confirmation``: typed, plain data in a YAML or JSON export), the
one line that the terminal, the note, the report and the exports say it in, and the round's
table with the lines under it (terminal and report)."""

from __future__ import annotations

import dataclasses
import math
import shlex
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autotune import study as studies
from autotune.display._text import (
    command,
    fit,
    fmt,
    fmt_within,
    metric_unit,
    plural,
    study_options,
    visible,
)
from autotune.machine.interference import INTERFERENCE_SHARE
from autotune.spacefile import DEFAULT_STORAGE, Spec
from autotune.study import REFERENCE_NAMES, UNCONFIRMED, Answer, trials_named


@dataclass(frozen=True)
class TrialConfirmation:
    """The confirmation round's verdict on one trial (the study's ``Answer``, for the answer):
    its medians and, for the answer, its ratios over the references and its ties."""

    median: float
    runs: int
    spread: float | None = None  # the round's relative spread (0.1: ±10%)
    median_score: float | None = None
    median_samples_per_second: float | None = None
    answer: bool = False  # the round's winner: the study's answer
    # the answer's metric over the untuned baseline's, and over the tuning checklist's, where
    # the round backs them (None: too noisy, or none; ``said`` says which)
    speedup: float | None = None
    over_checklist: float | None = None
    speedup_interval: tuple[float, float] | None = None  # where the speed-up may lie
    said: tuple[str, ...] = ()  # the answer over each reference, as the terminal says it
    reference: str | None = None  # the answer is this reference ("the tuning checklist")
    # trials within the noise of the answer (a reference it is tied with: in ``said``, once)
    tied_with: tuple[int, ...] = ()
    tie_rule: str = "value"  # how it was named among them: "score" (the better median score)
    under_interference: bool = False  # every run measured while others used the CPU
    searched: bool = True  # the study tried a configuration besides the references

    def to_dict(self) -> dict[str, Any]:
        """Plain data (an export's "confirmation")."""
        plain = {**dataclasses.asdict(self), "tied_with": list(self.tied_with)}
        if self.speedup_interval is not None:  # JSON has no infinity: an unbounded end is null
            low, high = self.speedup_interval
            plain["speedup_interval"] = [low, high if math.isfinite(high) else None]
        return {**plain, "said": list(self.said)}

    @classmethod
    def of(cls, answer: Answer | None, number: int) -> TrialConfirmation | None:
        """Trial ``number`` in the round that confirms the study's ``answer``: its medians,
        and for the answer its ratios over the references and its ties; None where the
        round does not confirm the answer or did not rank the trial."""
        if answer is None or not answer.confirmed:
            return None
        found = answer.configuration(number)
        if found is None or not found.confirmable:
            return None
        mine = number == answer.number
        baseline = answer.over(REFERENCE_NAMES["baseline"])
        return cls(
            median=found.median,
            runs=len(found.values),
            spread=answer.spread,
            median_score=found.median_score,
            median_samples_per_second=found.median_samples_per_second,
            answer=mine,
            speedup=answer.speedup if mine else None,
            over_checklist=answer.ratio_over(REFERENCE_NAMES["checklist"]) if mine else None,
            speedup_interval=baseline.interval if mine and baseline is not None else None,
            said=tuple(r.said for r in answer.references) if mine else (),
            reference=answer.reference if mine else None,
            tied_with=_tied_leaders(answer) if mine else (),
            tie_rule=answer.tie_rule if mine else "value",
            under_interference=found.interfered,
            searched=answer.searched,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TrialConfirmation | None:
        """Inverse of ``to_dict``; None for an empty or missing one (not confirmed)."""
        if not data:
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {key: value for key, value in data.items() if key in known}
        fields["tied_with"] = tuple(fields.get("tied_with") or ())
        fields["said"] = tuple(fields.get("said") or ())
        if fields.get("speedup_interval") is not None:
            low, high = fields["speedup_interval"]
            fields["speedup_interval"] = (low, math.inf if high is None else high)
        return cls(**fields)


def round_figures(found: TrialConfirmation | None, score_name: str, number: int) -> str | None:
    """What the figures beside a confirmed median rest on: the round's medians of the same
    runs, and that a trial's measurements shown below it are its trial's own ("the round's
    medians: validation accuracy 0.94, 27,000 samples/s; the figures below are trial 4's own
    measurement"); None where its value is its trial's own too (not confirmed)."""
    if found is None:
        return None
    medians = [f"validation {score_name} {fmt(found.median_score)}"] * (
        found.median_score is not None
    )
    if found.median_samples_per_second:
        medians.append(f"{fmt(found.median_samples_per_second)} samples/s")
    said = f"the round's medians: {', '.join(medians)}; " if medians else ""
    return f"{said}the figures below are trial {number}'s own measurement"


# a round that ran every run and named no answer: only a new round (--again) measures anything
COMPLETE_UNCONFIRMED = ("few_runs", "no_winner")


def _tied_leaders(answer: Answer) -> tuple[int, ...]:
    """The trials tied with the answer but the references its ``said`` names tied."""
    said = {reference.number for reference in answer.references if reference.tied}
    return tuple(number for number in answer.tied if number not in said)


def confirmation_text(
    found: TrialConfirmation | None,
    study: str,
    interleaved: str = "",
    storage: str = DEFAULT_STORAGE,
    round_state: str = "none",
) -> str:
    """One line on how sure ``study`` is of a trial: its ``TrialConfirmation``, or None (why
    not, by the ``round_state`` of the study's answer, and the command to confirm it:
    ``--storage`` where ``storage`` is not the default); ``interleaved``: what its runs
    alternated with (the note says it)."""
    words = ("autotune", "confirm", *study_options(study, storage))
    again = shlex.join(visible(word) for word in words)
    if found is None:
        why = UNCONFIRMED.get(round_state, UNCONFIRMED["none"])
        advised = round_state not in ("confirmed", "alone")  # a round would do nothing new
        again += " --again" * (round_state in COMPLETE_UNCONFIRMED)
        return f"not confirmed: {why}" + f" (run `{again}`)" * advised
    median = fmt_within(found.median, found.spread)
    # every run under load: said first, not after the ratios it qualifies (a user read a
    # "1.31x the tuning checklist (1.14x to 1.52x)" as a gain; the next round reversed it)
    state = "confirmed under load" if found.under_interference else "confirmed"
    text = f"{state}: median {median} over {found.runs} run{'s' * (found.runs != 1)}"
    if interleaved:
        text += f", interleaved with {interleaved}"
    if found.spread is not None:
        text += f" (spread ±{found.spread:.0%})"
    if found.said:
        text += f"; {'; '.join(found.said)}"
    if found.reference is not None:
        # beyond the round's noise: a tied trial's median may be higher (a new user read "found
        # nothing better" beside a tied trial 17 at 3.25 against the checklist's 3.12)
        found_none = "the search found nothing better" + " beyond noise" * bool(found.tied_with)
        tried_none = "no configuration besides the references was tried"
        text += f"; it is {found.reference}: {found_none if found.searched else tried_none}"
    if found.tied_with:
        text += f"; tied within noise with {trials_named(sorted(found.tied_with))}"
        text += ", and named for its better median score" * (found.tie_rule == "score")
    if found.under_interference:
        quiet = f"on a quiet machine, run `{again} --again`"  # a plain confirm keeps it
        text += f"; measured while other processes used the CPU ({quiet})"
    return text


def print_confirmation(
    console: Console, answer: studies.Answer, spec: Spec, study_name: str
) -> None:
    """The confirmation round behind the study's answer (``studies.answer_of``, once a round
    exists): each configuration's median and range, the answer, ties, its ratio over each
    reference the round measured beside it, and what the round cost."""
    if answer.round_state == "alone":  # no round ran: no table
        console.print(f"[yellow]Not confirmed:[/] {studies.UNCONFIRMED['alone']}.")
        return
    unit = metric_unit(spec.objective.metric_name)
    table = Table(
        title=f"Confirmation ({answer.repeats} more runs each, interleaved)", title_justify="left"
    )
    table.add_column("trial", justify="right")
    table.add_column(f"median {unit}", justify="right", style="bold green")
    table.add_column("range", justify="right")
    table.add_column(f"median {spec.objective.score_name}", justify="right")
    # the medians' runs: of how many (whole: "4 of 5 (2 retakes)" wrapped at its "(")
    table.add_column("runs used", justify="right", no_wrap=True)
    for row in confirmation_rows(answer):
        table.add_row(*row)
    console.print(fit(table, console))
    # after the table, as wide as the console (a caption wraps to the table's width)
    console.print(Text(runs_used_note(answer)))
    again = command("autotune", "confirm", *study_options(study_name, spec.study.storage))
    if not answer.confirmed:
        why = studies.UNCONFIRMED[answer.round_state]
        if answer.round_state in COMPLETE_UNCONFIRMED:  # the same command would do nothing
            again += " --again"
        console.print(f"[yellow]Not confirmed:[/] {why}; confirm again: {again}")
    else:
        _print_confirmed(console, answer, study_name, again)
    if answer.flagged:
        console.print(flagged_measurements(answer), style="yellow")
    for line in missed_the_bar(answer):
        console.print(line, style="yellow", markup=False)
    console.print(confirmation_cost(answer), style="dim")


def missed_the_bar(answer: studies.Answer) -> list[str]:
    """A line for each searched leader that met the bar in its own trial and missed it in
    runs of the round, at other seeds: the table's "-" and "2 of 4" left a new user to work
    out that the search's best (0.93 accuracy) had fallen to 0.68 and 0.89."""
    lines = []
    for found in answer.configurations:
        missed = found.runs - found.feasible_runs
        if found.reference is None and found.trial_feasible and missed:
            lines.append(
                f"Trial {found.trial} met the bar in its own trial but missed it in {missed} of "
                f"its runs in the round, at other seeds: its rank in the search was partly its "
                f"seed's luck."
            )
    return lines


def confirmation_rows(answer: studies.Answer) -> list[tuple[str, str, str, str, str]]:
    """The confirmation table's rows, in the terminal and the report: each configuration's
    label, median (to the digits the round's spread leaves it; "tied" where the round could not
    tell it from the answer), range, median score and runs used ("-" where it has no median)."""
    rows = []
    for found in answer.configurations:
        label, used = found.label, _runs_used(found)
        if not found.values or not (found.eligible or found.reference):
            score = fmt(found.median_score) if found.scores else "-"
            rows.append((label, "-", "-", score, used))
            continue
        low, high = (fmt_within(value, answer.spread) for value in (found.low, found.high))
        median = fmt_within(found.median, answer.spread) + " tied" * answer.tied_with(found)
        rows.append((label, median, f"{low}-{high}", fmt(found.median_score), used))
    return rows


def runs_used_note(answer: studies.Answer) -> str:
    """What the confirmation table's "runs used" counts, in the terminal and the report."""
    retaken = any(found.retakes for found in answer.configurations)
    return (
        "runs used: the measurements each median counts: feasible, and measured alike (quiet, "
        "the trial's own among them; or the round's own under load)"
        + ("; a retake: a run measured again, the machine busy the first time" if retaken else "")
    )


def confirmation_cost(answer: studies.Answer) -> str:
    """What the round cost, against the trials' seconds (wall-clock, stage 1 not counted):
    "confirmation: 9 runs, 18 s, 60% of the trials' 30 s"."""
    share, cost = answer.search_share, answer.cost_seconds
    share_text = f", {share:.0%} of the trials' {cost / share:.0f} s" if share else ""
    return f"confirmation: {answer.round_runs} runs, {answer.cost_seconds:.0f} s{share_text}."


def flagged_measurements(answer: studies.Answer) -> str:
    """The round's measurements taken under interference: how many, which of them the round
    measured again (never a trial's own), and how the round compares them."""
    originals, own = answer.flagged_originals, answer.flagged - answer.flagged_originals
    search_load, load = answer.search_load or (), answer.load or ()
    search = f" (the search's, at {studies.loads_said(search_load)})" * bool(search_load)
    which = [f"{originals} of the trials' own{search}, never compared with the round's runs"]
    which *= bool(originals)
    again = "each" if answer.retakes >= own else f"{answer.retakes or 'none'} of them"
    which += [f"{own} of the round's ({again} measured again)"] * bool(own)
    compared = f" (in the runs it compares, others took {studies.loads_said(load)})" * bool(load)
    return (  # the round's: the trials it does not measure again are not counted
        f"{plural(answer.flagged, 'measurement')} of the round's configurations "
        f"{'was' if answer.flagged == 1 else 'were'} "
        f"taken while other processes took more than {INTERFERENCE_SHARE:.0%} of the cores: "
        f"{', and '.join(which)}. The round compares flagged runs only with its own flagged "
        f"ones{compared}."
    )


def _runs_used(found: studies.Confirmed) -> str:
    """ "3", "2 of 3", "7 (4 retakes)": the measurements a median counts, of how many, and how
    many of those were runs measured again."""
    counted, measured = len(found.values), found.all_runs
    shown = str(counted) + ("" if counted == measured else f" of {measured}")
    return shown + (f" ({plural(found.retakes, 'retake')})" if found.retakes else "")


def _print_confirmed(
    console: Console, answer: studies.Answer, study_name: str, again: str
) -> None:
    """A confirmed answer in the verdict's one wording (``confirmation_text``: the note, the
    report and the exports say it alike) and, for a noisy round, how to confirm it again."""
    said = confirmation_text(TrialConfirmation.of(answer, answer.number), study_name)
    console.print(f"[bold]Answer: trial {answer.number}[/], {escape(said)}.")
    if answer.noisy:  # a new round, the noisy one replaced: a plain confirm has nothing to do
        console.print(f"{escape(noisy_round(answer))}: {again} --again", style="yellow")


def noisy_round(answer: studies.Answer) -> str:
    """Why a round too noisy to rank its leaders could not, with the figures, and what can
    separate them (the terminal adds the command; the report says it under its table)."""
    return (
        f"The round was too noisy to rank the leaders ({_why_noisy(answer)}): trial "
        f"{answer.number} is named for the best median{_apart(answer)}. "
        f"{_how_to_separate(answer)}"
    )


def _apart(answer: studies.Answer) -> str:
    """Where the named trial's runs all beat every other configuration's, the figures, with
    what the noise leaves open ("" where they overlap): a new user read "too noisy to rank"
    beside runs of 11.7-15.4 against at most 8.63 as a contradiction."""
    mine = answer.winner
    others = [c for c in answer.configurations if c is not mine and c.values]
    if mine is None or not mine.values or not others or answer.noise != "varied":
        return ""  # a wide spread by itself: no load to blame a gap on
    if answer.maximize:
        bound = max(c.high for c in others)
        beaten, against = mine.low > bound, f"at most {fmt(bound)}"
    else:
        bound = min(c.low for c in others)
        beaten, against = mine.high < bound, f"at least {fmt(bound)}"
    edge = f"{fmt(mine.low)}-{fmt(mine.high)}"
    return (
        f"; its runs ({edge}) all beat every other's ({against}), as a varying load can" * beaten
    )


def _why_noisy(answer: studies.Answer) -> str:
    """Why a noisy round (``Answer.noise``) could not rank its leaders, with the figures."""
    if not answer.alike:
        return "some were measured only on a quiet machine, others only under interference"
    if answer.noise == "varied":
        took = studies.loads_said(answer.load or ())
        return f"the load varied: other processes took {took} of the cores"
    spread = f"±{answer.spread:.0%}" if answer.spread is not None else "unknown"
    return f"run-to-run spread {spread}, over ±{studies.NOISY_SPREAD:.0%}"


def _how_to_separate(answer: studies.Answer) -> str:
    """What can separate the leaders of a noisy round: a quiet machine where others took the
    cores; where none did, the runs vary by themselves, and only longer or more runs can."""
    if answer.flagged or answer.noise == "varied":
        return "Confirm again on a quiet machine"
    return (
        "The machine was quiet: its runs vary that much by themselves, so a quieter one will "
        "not separate them; longer trials (workload.epochs) or more runs (--repeats) can"
    )
