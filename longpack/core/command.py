"""What every longpack command shares (`pack`, `train`, `zoo`): a LongpackError, a problem the
user can fix, becomes click's one-line error and exit status 1; a usage error (an unknown flag,
a value not among a flag's choices, a missing option) is one line too, with exit status 2;
anything else is a bug and keeps its traceback. Commands are declared with these classes, never
with their own try/except."""

import click

from longpack.core.errors import LongpackError

# A group run without a command prints its help through a usage error: that stays as it is.
NO_ARGS_IS_HELP = click.exceptions.NoArgsIsHelpError


class OneLineUsageError(click.UsageError):
    """click's usage error without the usage block above it: the error and where help is, in
    one line, as every other refusal is."""

    def __init__(self, message: str, ctx=None, points_to_help: bool = True):
        super().__init__(message, ctx)
        self.points_to_help = points_to_help  # False: the line names what to fix (a file)

    def show(self, file=None) -> None:
        where = (f" (see '{self.ctx.command_path} --help')"
                 if self.ctx is not None and self.points_to_help else "")
        click.echo(f"Error: {self.format_message().rstrip('.')}{where}", file=file,
                   err=file is None, color=self.ctx.color if self.ctx is not None else None)


def one_line(e: click.UsageError, points_to_help: bool = True) -> OneLineUsageError:
    short = OneLineUsageError(e.message, e.ctx, points_to_help)
    # its own words: "Invalid value for '--flag': ...", "No such option: --x Did you mean --y?"
    short.format_message = e.format_message
    return short


class OneLineUsage:
    """Parsing's usage errors (a command's own or a group's) said in one line."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except (OneLineUsageError, NO_ARGS_IS_HELP):
            raise
        except click.UsageError as e:
            raise one_line(e) from None


class Command(OneLineUsage, click.Command):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except LongpackError as e:
            raise click.ClickException(str(e)) from None
        except OneLineUsageError:
            raise
        except click.UsageError as e:  # a command's own check: its line says what to do
            raise one_line(e, points_to_help=False) from None


class Group(OneLineUsage, click.Group):
    """A group whose commands are Commands."""

    command_class = Command

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            raise one_line(e) from None
