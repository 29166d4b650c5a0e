"""What the framework files are made of: a call's keywords, each with a comment saying where
its value came from (the study's search, stage 1, or the space file's one value)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config import TrialConfig
from autotune.export._api import BestConfig
from autotune.export._bundle import literal

LINE_LENGTH = 99  # what the generated files are linted to (ruff's E501, this project's width)
ARGUMENT_INDENT = 8  # the templates' indentation of a call's keywords


@dataclass(frozen=True)
class Argument:
    """One keyword of a generated call: ``name=value,  # comment``."""

    name: str  # a Python argument name, autotune's own
    value: str  # Python source of the value: a literal (or a call of literals)
    comment: str = ""  # autotune's words and numbers only

    @property
    def line(self) -> str:
        """The call's line(s) for it, the template indenting them by ARGUMENT_INDENT: the
        comment after the code, or above it when both would not fit in the line."""
        code = f"{self.name}={self.value},"
        if not self.comment:
            return code
        comment = f"# {comment_text(self.comment)}"
        first = code.splitlines()[0]
        if "\n" in code or ARGUMENT_INDENT + len(f"{first}  {comment}") > LINE_LENGTH:
            return f"{comment}\n{code}"
        return f"{code}  {comment}"


def comment_text(text: str) -> str:
    """``text`` safe in a ``#`` comment: printable ASCII on one line (others escaped), even
    if a value that reached it was not what autotune wrote."""
    return literal(str(text))[1:-1]


def searched(best: BestConfig, knob: str, text: str = "") -> str:
    origin = best.origin(knob)
    return "; ".join(([origin] if origin else []) + ([text] if text else []))


def tuned(best: BestConfig, keyword: str, knob: str, text: str = "") -> Argument:
    """``keyword=`` the configuration's value of ``knob``, noting where it came from."""
    return Argument(keyword, literal(getattr(best.config, knob)), searched(best, knob, text))


def lr_text(config: TrialConfig) -> str:
    """What the learning rate is per, as every exported file's comment says it."""
    if config.lr_scaling == "none":
        return "per optimizer step"
    return (
        f"{config.base_lr:.6g} per {config.base_batch_size} examples, scaled "
        f"{config.lr_scaling} to the effective batch of {config.effective_batch_size}"
    )


def loader_arguments(best: BestConfig, prefix: str = "") -> list[Argument]:
    """The DataLoader's tuned settings (keywords of DataLoader, or TrainingArguments'
    ``dataloader_*`` fields with ``prefix``)."""
    config = best.config
    workers = config.num_workers if config.data_pipeline == "dataloader" else 0
    rows = [
        Argument(f"{prefix}num_workers", literal(workers), searched(best, "num_workers")),
        tuned(best, f"{prefix}pin_memory", "pin_memory"),
    ]
    if workers > 0:
        rows.append(
            Argument(
                f"{prefix}prefetch_factor",
                literal(config.prefetch_factor or 2),
                searched(best, "prefetch_factor", "batches each worker loads ahead"),
            )
        )
        rows.append(tuned(best, f"{prefix}persistent_workers", "persistent_workers"))
    return rows
