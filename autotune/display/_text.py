"""How values, units and commands are written for people: numbers, metrics, copyable commands."""

from __future__ import annotations

import math
import shlex
import textwrap
from collections.abc import Sequence
from typing import Any

from optuna.trial import FrozenTrial
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from autotune import study as studies
from autotune.config import TrialConfig
from autotune.knobs import as_written
from autotune.machine.scaleout import WorkerShare, unused_cores
from autotune.spacefile import DEFAULT_STORAGE, SCORES, ObjectiveSpec, is_unprintable


def metric_unit(metric: str) -> str:
    """The unit a study's values are shown in, from the metric it records
    (``ObjectiveSpec.metric_name``): ``acc/s``, ``macro_f1/s``, ``s to target``; "" for a metric
    autotune does not know."""
    if metric == "samples_per_second":  # the speed stage's studies (NAME.speed)
        return "samples/s"
    if metric.startswith("time_to_"):
        return TO_TARGET
    if metric.endswith("_per_second"):
        name = metric.removesuffix("_per_second")
        short = SCORES[name][1] if name in SCORES else name
        return f"{short}/s"
    return ""


TO_TARGET = "s to target"  # the unit of a time to a target (``metric_unit``)


def value_text(value: float | None, unit: str, reached: bool = True) -> str:
    """A value with its unit, as every rendering says it: "2.912 acc/s", "0.311 s to target";
    a time to a target not ``reached`` is the seconds spent, never a time to the target:
    "target not reached in 0.311 s" ("target not reached" where ``value`` is None)."""
    if unit == TO_TARGET and not reached:
        return "target not reached" + (f" in {fmt(value)} s" if value is not None else "")
    return f"{fmt(value)} {unit}".rstrip()


def fmt(value: Any) -> str:
    """A value as the terminal, the note and the report show it: a float to 4 significant
    digits, from 1,000 whole and thousands separated (``0.000221``, ``2.781``, ``6,872``,
    ``27,712``: a column of samples/s reads alike); a bool as ``true``/``false``, None ``-``."""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e3 else f"{value:.4g}"
    return "-" if value is None else as_written(value)


def fmt_within(value: float, spread: float | None) -> str:
    """``value`` to the digits a relative ``spread`` (0.03: ±3%) leaves it, 2 to 4
    significant: ``0.312`` at ±3%, ``0.31`` at ±10% (four digits of a time that varies by a
    tenth promise a precision the runs do not have), its whole digits always (``156`` at
    ±20%); ``fmt``'s without a spread, and from 1,000."""
    if not spread or spread <= 0 or not math.isfinite(value) or not value or abs(value) >= 1e3:
        return fmt(value)
    digits = min(4, max(2, 1 + math.ceil(-math.log10(spread))))
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))  # whole digits kept
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".") if decimals else f"{value:.0f}"


_METRIC_FORMATS: dict[str, Any] = {
    **dict.fromkeys(
        ("charged_seconds", "train_seconds", "overhead_seconds"), lambda v: f"{fmt(v)} s"
    ),
    "compile_seconds": lambda v: f"{v:.1f} s",
    "achieved_flops": lambda v: f"{v / 1e9:,.1f} GFLOP/s",
    "mfu": lambda v: f"{v:.1%}",
    "gpu_utilization": lambda v: f"{v:.0%}",
    "data_wait_fraction": lambda v: f"{v:.1%}",
    "gpu_memory_used_bytes": lambda v: f"{v / 2**30:.2f} GiB",
    "peak_memory_bytes": lambda v: f"{v / 2**20:,.0f} MiB",
    "other_cpu_share": lambda v: f"{v:.1%} of its cores (other processes)",
}


# what `autotune best` says beside a measurement whose name alone misleads
METRIC_NOTES = {
    "charged_seconds": "the seconds its trial's value is based on",
    "train_seconds": "training time, overhead_seconds included",
    "overhead_seconds": "one-time costs: compile, warm-up, worker start",
}


def lr_text(config: TrialConfig) -> str:
    """What the learning rate is per, as the exported files and the configuration tables say."""
    if config.lr_scaling == "none":
        return "per optimizer step"
    return (
        f"{fmt(config.base_lr)} per {config.base_batch_size} examples, scaled "
        f"{config.lr_scaling} to the effective batch of {config.effective_batch_size}"
    )


def score_text(goal: ObjectiveSpec, value: float | None, short: bool = True) -> str:
    """A validation score with its name: ``acc 0.953`` (``accuracy 0.953`` unless ``short``)."""
    name = goal.score_short if short else goal.score_name
    return f"{name} {fmt(value)}"


def fmt_metric(key: str, value: Any) -> str:
    """A trial measurement in its unit (seconds, GFLOP/s, %, MiB) where it has one."""
    if isinstance(value, int | float) and not isinstance(value, bool) and key in _METRIC_FORMATS:
        return _METRIC_FORMATS[key](value)
    return fmt(value)


def storage_waiting(problem: str, seconds: float) -> Text:
    """What is said when the study's database stops answering (``OutageRetry.on_wait``)."""
    return Text(
        f"the study's database does not answer ({problem}); waiting up to {seconds:g} s for it "
        f"(study.storage_outage)",
        style="yellow",
    )


def storage_back(seconds: float) -> Text:
    """What is said when the study's database answers again (``OutageRetry.on_back``)."""
    return Text(f"the study's database answers again after {seconds:.0f} s", style="dim")


def visible(text: str) -> str:
    """``text`` with its control and format characters (escape sequences, newlines, carriage
    returns, bidi overrides, NUL) written as escapes (``\\x1b``, ``\\u202e``): a study name
    from a shared database may hold them, and the terminal must show them, not obey them."""
    return "".join(
        char.encode("unicode_escape").decode("ascii") if is_unprintable(char) else char
        for char in text
    )


def command(*words: str) -> str:
    """A command line for the user to copy, as rich markup: each word quoted for the shell and
    the whole escaped, so that a study name such as ``run[fast]`` or ``a b`` survives both (and
    one with control characters is shown, never obeyed: ``visible``)."""
    return escape(shlex.join(visible(word) for word in words))


def print_item(console: Console, label: str, value: str, *, copy: bool = False) -> None:
    """``label value`` on one line where it fits the console; else the label, then the value on
    lines of its own, indented: wrapped between words, or, to ``copy`` (a command, a URL),
    never broken by a newline (the terminal wraps it; a copy of it stays whole)."""
    line = Text.assemble((label, "bold"), " ", value)  # Text: the value is data, never markup
    if line.cell_len <= console.width:
        console.print(line, soft_wrap=True, highlight=False)
        return
    console.print(Text(label, style="bold"))
    if copy:
        console.print(Text(f"  {value}"), soft_wrap=True, highlight=False)
    else:
        console.print(Padding(Text(value), (0, 0, 0, 2)), highlight=False)


def print_fact(console: Console, line: str) -> None:
    """``line`` (plain text: "confirmed: median ...") indented two spaces; where it wraps, its
    further lines sit two deeper, under its label, wrapped between words."""
    wrapped = textwrap.wrap(
        line, console.width, initial_indent="  ", subsequent_indent="    ",
        break_long_words=False, break_on_hyphens=False,
    )  # fmt: skip
    console.print(Text("\n".join(wrapped)), soft_wrap=True, highlight=False)


INDENT = 8  # where a live line goes on: under its first word's end


def words(text: str, style: str = "", gap: str = "  ") -> list[Text]:
    """``text``'s words as pieces for ``print_beside`` (a message, knobs: broken between words);
    ``gap`` before the first, a space before each other."""
    return [
        Text(gap * (i == 0) + " " * (i > 0) + word, style) for i, word in enumerate(text.split())
    ]


def print_beside(
    console: Console, line: Sequence[Text], rest: Sequence[Text] = (), hang: int = INDENT
) -> None:
    """``line``'s pieces then ``rest``'s (each a piece with its gap before it: a figure with its
    unit is one, never split) on one line where they fit the console; else broken between
    pieces, ``line``'s further lines indented ``hang``, and ``rest`` beside its last where it
    fits (not beside a message hung at ``hang``), else on lines of its own indented ``INDENT``:
    never cut, no empty line."""
    lines = _lay_out([Text()], line, console.width, hang)
    hung = len(lines) > 1 and hang != INDENT  # a message hung under itself: rest under it
    if rest and (hung or lines[-1].cell_len + sum(p.cell_len for p in rest) > console.width):
        lines.append(Text(" " * INDENT))
    for shown in _lay_out(lines, rest, console.width, INDENT):
        console.print(shown, soft_wrap=True)  # each fits, but a piece wider than a line


def _lay_out(lines: list[Text], pieces: Sequence[Text], width: int, indent: int) -> list[Text]:
    """``pieces`` after ``lines``' last, a new line (indented ``indent``) where one has no room;
    a line's first piece without the gap before it."""
    for piece in pieces:
        if lines[-1].plain.strip() and lines[-1].cell_len + piece.cell_len > width:
            lines.append(Text(" " * indent))
        if not lines[-1].plain.strip():
            piece = piece[len(piece.plain) - len(piece.plain.lstrip(" ")) :]
        lines[-1].append_text(piece)
    return lines


def fit(table: Table, console: Console) -> Table:
    """``table`` with its columns shared out as rich does not, where it is wider than
    ``console``: each as wide as its longest word (a figure, a knob), then whole, the narrowest
    wants first, as the width allows (rich shares evenly and cuts a figure: "0.07633-0.077…"
    beside a header that could wrap); with a space between columns, not a border, where the
    longest words have no room for borders; where they have none at all, the widest column
    folds (never cut). A ``no_wrap`` column keeps each cell whole."""
    wanted = [
        [Measurement.get(console, console.options, cell) for cell in (c.header, *c.cells)]
        for c in table.columns
    ]
    low = [  # a no_wrap column's cells whole: "4 of 5 (2 retakes)" never wraps at its "("
        max(m.maximum if c.no_wrap else m.minimum for m in column)
        for c, column in zip(table.columns, wanted, strict=True)
    ]
    more = [max(m.maximum for m in col) - least for col, least in zip(wanted, low, strict=True)]
    spare = console.width - 3 * len(low) - 1 - sum(low)  # a border and a space each side
    if spare >= sum(more):
        return table
    if spare < 0:  # as `autotune studies`: a space between columns (and one of padding)
        table.box, table.show_edge, table.pad_edge, table.collapse_padding = (
            box.SIMPLE_HEAD,
            False,
            False,
            True,
        )
        spare += len(low) + 3
    if spare < 0:  # no room still: the widest column folds, the others keep their longest words
        widest = low.index(max(low))
        table.columns[widest].overflow = "fold"
        low[widest], spare = max(1, low[widest] + spare), 0
    for index in sorted(range(len(more)), key=more.__getitem__):
        table.columns[index].width = low[index] + min(more[index], spare)
        spare -= min(more[index], spare)
    return table


def print_command(console: Console, label: str, *words: str) -> None:
    """A command for the user to copy, after its label; never broken (see ``print_item``)."""
    print_item(console, label, shlex.join(words), copy=True)


def study_options(study_name: str, storage: str) -> list[str]:
    """``--study NAME`` and ``--storage URL`` (password ``***``) unless it is the default."""
    shown = studies.display_url(storage)
    return ["--study", study_name, *([] if storage == DEFAULT_STORAGE else ["--storage", shown])]


def si(value: float) -> str:
    """A rate or a size to one decimal of a unit prefix (``7.8k``, ``1.2M``), for the live lines
    alone: a trial's line must fit 80 columns. Everywhere else, ``fmt``."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


# the knobs that change speed the most, shown first where a line has room for only some
FIRST_KNOBS = ("precision", "data_pipeline", "compile", "batch_size", "lr")


def params(trial: FrozenTrial, own: bool = False) -> str:
    """A trial's searched knobs as ``name=value``, those of FIRST_KNOBS first; ``own``: a
    reference's own execution knobs too (the untuned baseline's DataLoader without workers,
    which a two-stage study's references keep beside the parameters every trial samples)."""
    shown = dict(trial.params)
    record = studies.TrialRecord.of(trial)
    if own and record.reference is not None and record.config is not None:
        shown |= {name: getattr(record.config, name) for name in record.speed_knobs or ()}
    first = [name for name in FIRST_KNOBS if name in shown]
    rest = [name for name in shown if name not in FIRST_KNOBS]
    return " ".join(f"{name}={fmt(shown[name])}" for name in [*first, *rest])


def duration(seconds: float) -> str:
    """Seconds as a person reads an estimate: "95 s", "4 min" (from 120 s, to the nearest)."""
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def plural(count: int, noun: str) -> str:
    """ "1 trial", "2 trials"."""
    return f"{count} {noun if count == 1 else noun + 's'}"


def describe_shares(shares: list[WorkerShare]) -> str:
    """The plan's ``workers`` line: each share, and the cores left idle."""
    text = "; ".join(share.describe() for share in shares)
    idle = unused_cores(shares)
    if idle:
        text += f"; {len(idle)} core(s) idle (the shares are equal, so that trials compare)"
    return text
