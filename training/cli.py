"""`train`: the trainer's command line. Training itself has not landed yet (issue 5)."""

import click


@click.command()
@click.option("--list-models", is_flag=True, help="Print the model zoo's presets and exit.")
@click.version_option(package_name="longpack")
def train(list_models):
    """Train a model from archs/ on shards written by `pack build` (training: not yet)."""
    if list_models:
        import runpy

        runpy.run_module("archs", run_name="__main__")
        return
    raise click.ClickException("training is not implemented yet (it arrives with the trainer "
                               "issue); `train --list-models` shows the model zoo")
