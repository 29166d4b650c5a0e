"""What every command shares: the Typer app, the two consoles, exit codes and one-line errors."""

from __future__ import annotations

import inspect
import logging
import textwrap
import warnings
from typing import Annotated, Any

import typer
from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.segment import Segment
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from autotune.errors import UserError
from autotune.session import STORAGE_ENV  # the default of every command's --storage


class _PlainHelp:
    """Typer shows every boolean option as ``--help <bool>``: its own --help is shown as the
    plain flag it is (our flags say so with ``flag``)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


# click's errors (a wrong option or value, a command that does not exist): Typer's own click
# or the package's, whichever this Typer is built on
_CLICK_ERROR: type[Exception] = next(
    k for k in typer.BadParameter.__mro__ if k.__name__ == "ClickException"
)


def _usage_line(err: Any) -> typer.Exit:
    """A click error (an unknown option, a value of the wrong type) in one line and its exit
    status (2), naming the command's --help, not Typer's box of several lines."""
    ctx = getattr(err, "ctx", None)
    helped = f"; see {ctx.command_path} --help" if ctx is not None else ""
    return fail(f"{err.format_message().rstrip('.')}{helped}", err.exit_code)


class Group(_PlainHelp, TyperGroup):
    """The ``autotune`` group: a plain ``--help``; a user error that a command raises is said
    in a line (a line each of its lines), exit 1 (a command that exits otherwise catches its
    own); a wrong argument, option or command in a line, exit 2."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except _CLICK_ERROR as err:
            if type(err).__name__ == "NoArgsIsHelpError":  # plain `autotune`: the help
                raise
            raise _usage_line(err) from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as err:
            raise fail(str(err).splitlines(), EXIT_FAILED) from None
        except _CLICK_ERROR as err:  # a command's own arguments
            raise _usage_line(err) from None


class Command(_PlainHelp, TyperCommand):
    """Each command: a plain ``--help``, its docstring's paragraphs filled to the terminal's
    width (Typer's rich help keeps the line breaks of the source)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        paragraphs = inspect.cleandoc(self.help or "").split("\n\n")
        self.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The usage line names a required argument as ``SPACE_FILE``, not Typer's ``{...}``."""
        return [
            piece.removeprefix("{").removesuffix("}")
            for piece in super().collect_usage_pieces(ctx)
        ]


def flag(*names: str, help: str) -> Any:
    """A boolean option that takes no value, shown in --help as ``--name`` with no type."""
    return typer.Option(*names, metavar="", help=help)


# the options the commands share (Typer copies an option for each command that names it):
# --storage URL, by default $AUTOTUNE_STORAGE, else the SQLite file under studies/
STORAGE_OPTION = typer.Option(envvar=STORAGE_ENV, help="Optuna storage URL.")
# --study NAME; left out, the storage's only study (its speed study aside)
STUDY_OPTION = typer.Option(
    "--study", metavar="NAME", help="Study name. Default: the storage's only study."
)
# --artifacts DIR|s3://bucket, by default $AUTOTUNE_ARTIFACTS (see autotune.outputs.artifacts)
ARTIFACTS_OPTION = typer.Option(
    "--artifacts",
    envvar="AUTOTUNE_ARTIFACTS",
    metavar="DIR|s3://BUCKET",
    help="Where exported scripts and reports are attached for optuna-dashboard: a folder, "
    "or s3://bucket (needs boto3). Default: artifacts/ beside a SQLite database; other "
    "storages attach only where this names.",
)


app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # a bug gets a plain traceback; user errors get one line
    help="Find the PyTorch training configuration with the most accuracy per second.",
)


class _Trimmed:
    """A renderable whose lines end without the spaces rich pads them with (a table's cells,
    titles and captions, ``Padding``, a line wrapped between words): a copy of the output
    carries none. A space with a background colour is seen: it stays."""

    def __init__(self, renderable: ConsoleRenderable) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        segments = console.render(self.renderable, options)
        for line, ended in Segment.split_lines_terminator(segments):
            while ended and line and not line[-1].control:
                last = line[-1]
                if last.style is not None and last.style.bgcolor is not None:
                    break
                if last.text.rstrip(" "):
                    line[-1] = last._replace(text=last.text.rstrip(" "))
                    break
                line.pop()
            yield from line
            if ended:
                yield Segment.line()


class _TrimLines(RenderHook):
    """Every line a console prints, trimmed (``_Trimmed``); the live display's own lines,
    which it redraws, are added after this hook and left as they are."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Trimmed(renderable) for renderable in renderables]


# emoji=False: a name or value with ":fire:" in it is shown as it is, not as an emoji
console = Console(emoji=False)
console.push_render_hook(_TrimLines())
errors = Console(stderr=True, soft_wrap=True, emoji=False)  # one line at any width


def _version(shown: bool) -> None:
    if shown:
        from autotune._version import __version__

        console.print(f"autotune {__version__}", markup=False, highlight=False)
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", metavar="", callback=_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Find the PyTorch training configuration with the most accuracy per second."""


EXIT_USAGE = 2  # the user must change a file or an argument
EXIT_FAILED = 1  # the command ran but could not do its job
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM


def fail(lines: str | list[str], code: int = EXIT_USAGE) -> typer.Exit:
    """Each line as ``error: ...``: one line where stderr is a file or a pipe (a log, grep); on
    a terminal wrapped between words, its continuation indented, a path or URL never broken."""
    width = errors.width - len("error: ") if errors.is_terminal else None
    for line in [lines] if isinstance(lines, str) else lines:
        if width and len(line) > width:
            wrap = textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False)
            line = "\n       ".join(wrap)
        errors.print(Text("error: ", style="bold red") + Text(line))
    return typer.Exit(code)


def in_range(flag: str, value: float | None, low: float, high: float | None = None) -> None:
    """A numeric flag outside its range: one line and exit 2 (click's usage box is not)."""
    if value is not None and (value < low or (high is not None and value > high)):
        bound = f"from {low:g} to {high:g}" if high is not None else f"{low:g} or more"
        raise fail(f"{flag} {value:g}: it must be {bound}")


def quiet_libraries(verbose: bool) -> None:
    """Optuna's per-trial log lines and torch's build chatter off, unless --verbose."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.ERROR)
    if not verbose:
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        # autotune reports worker counts above the core count once, before the study
        warnings.filterwarnings("ignore", message="This DataLoader will create")
