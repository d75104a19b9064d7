"""`train`: the trainer's command line. Training itself has not landed yet (issue 5)."""

import click


@click.command()
@click.version_option(package_name="longpack")
def train():
    """Train a model from archs/ on shards written by `pack build` (not implemented yet)."""
    raise click.ClickException("train is not implemented yet: it arrives with the trainer issue; "
                               "`pack build` output is ready for it")
