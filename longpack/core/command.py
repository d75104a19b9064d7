"""What every longpack command shares (`pack`, `train`, `zoo`): a LongpackError, a problem the
user can fix, becomes click's one-line error and exit status 1; anything else is a bug and
keeps its traceback. Commands are declared with these classes, never with their own
try/except."""

import click

from longpack.core.errors import LongpackError


class Command(click.Command):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except LongpackError as e:
            raise click.ClickException(str(e)) from None


class Group(click.Group):
    """A group whose commands are Commands."""

    command_class = Command
