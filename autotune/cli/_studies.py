"""``autotune studies``: a storage's studies, their trials by how they ended and their answers,
each study's stage 1 (``NAME.speed``) in the row under it; ``--delete NAME`` takes one out
(``_delete``)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.text import Text

from autotune.cli._common import STORAGE_OPTION, Command, app, console, flag, quiet_libraries
from autotune.spacefile import DEFAULT_STORAGE

SPEED_ROW = "└ stage 1"  # a study's speed study (NAME.speed), in the row under it

# trials counted per study, by how they ended (study.count_endings)
_COUNTED = ("complete", "pruned", "failed", "interrupted", "running")
# shown only where a study has such a trial: the table fits 80 columns
_WHERE_ANY = ("interrupted", "running")


@app.command("studies", cls=Command)
def list_studies(
    storage: Annotated[str, STORAGE_OPTION] = DEFAULT_STORAGE,
    as_json: Annotated[bool, flag("--json", help="Print machine-readable JSON.")] = False,
    delete: Annotated[
        str | None,
        typer.Option(
            "--delete",
            metavar="NAME",
            help="Delete study NAME (refused while it runs), and its stage-1 measurements "
            "(NAME.speed) unless another study may reuse them.",
        ),
    ] = None,
) -> None:
    """List a storage's studies and their best values, or delete one."""
    import optuna
    from rich import box
    from rich.table import Table

    from autotune import display
    from autotune import study as studies

    quiet_libraries(verbose=False)
    if delete is not None:
        from autotune.cli._delete import delete_study

        for line in delete_study(delete, storage):
            console.print(line, markup=False, highlight=False)
        return
    backend = studies.open_storage(storage, "read")
    summaries = optuna.get_all_study_summaries(backend, include_best_trial=False)
    shown = studies.display_url(storage)
    rows: list[dict[str, Any]] = []
    tables = {}  # a study's stage-1 table, by its speed study's name (a parent sorts first)
    for summary in sorted(summaries, key=lambda s: s.study_name):
        study = optuna.load_study(study_name=summary.study_name, storage=backend)
        count = studies.count_endings(study.get_trials(deepcopy=False))
        answer = studies.answer_of(study)
        top = answer.trial if answer is not None else None
        record = studies.StudyRecord.of(study)
        if record.speed_table is not None:
            tables[studies.speed_study_name(summary.study_name)] = record.speed_table
        row = {
            "study": summary.study_name,
            "metric": record.metric or next(iter(study.metric_names or []), None),
            **{column: count.get(column, 0) for column in _COUNTED},
            # the round's median where it confirmed the answer, else its one trial's
            "best_value": answer.headline[0] if answer is not None else None,
            "best_source": answer.headline[1] if answer is not None else None,
            "best_trial": top.number if top else None,
        }
        rows.append({**row, **_fastest_row(tables.get(summary.study_name))})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not summaries:
        console.print(f"No studies in {shown}.", markup=False)
        return
    display.print_item(console, "Studies in", shown, copy=True)
    # a study's stage-1 measurements (NAME.speed) under it, not among the user's studies
    parents = {studies.speed_study_name(str(row["study"])): str(row["study"]) for row in rows}
    rows.sort(key=lambda row: (parents.get(row["study"], row["study"]), row["study"] in parents))
    # stored names are data, never markup
    labels = [SPEED_ROW if row["study"] in parents else display.visible(str(row["study"]))
              for row in rows]  # fmt: skip
    # no vertical rules and the unit beside the best value: the table fits 80 columns
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    longest = max(map(len, labels), default=5)
    table.add_column("study", overflow="fold", min_width=min(32, longest))
    counted = [c for c in _COUNTED if c not in _WHERE_ANY or any(row[c] for row in rows)]
    for column in counted:
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("best", justify="right", no_wrap=True)
    table.add_column("trial", justify="right", no_wrap=True)
    for row, label in zip(rows, labels, strict=True):
        metric = str(row["metric"] or "-")
        unit = display.metric_unit(metric) or metric
        # trials that completed, none at the bar: said, not a value of "-"
        best = "none feasible" if row["complete"] else "-"
        if row["best_value"] is not None:
            best = f"{display.fmt(row['best_value'])} {unit}"
        table.add_row(
            Text(label),
            *(str(row[column]) for column in counted),
            Text(best),
            str(row["best_trial"]) if row["best_trial"] is not None else "-",
        )
    console.print(table)
    if SPEED_ROW in labels:
        console.print(f"{SPEED_ROW}: the speed measurements of the study above (its NAME.speed)")


def _fastest_row(table: Any) -> dict[str, Any]:
    """A speed study's best as its stage-1 table says it (``table``: its study's stored
    SpeedTable; None: not one, or not stored): the fastest row's samples/s and its first
    measurement. The raw fastest measurement was not in the table: one busy burst of a
    setting that lost its cell (9,163 beside the table's 7,813)."""
    rows = [c for c in table.choices if c.measured] if table is not None else []
    if not rows:
        return {}
    fastest = max(rows, key=lambda c: c.samples_per_second)
    trial = fastest.speed_trials[0] if fastest.speed_trials else None
    source = "stage 1's table"
    return {"best_value": fastest.samples_per_second, "best_source": source, "best_trial": trial}
