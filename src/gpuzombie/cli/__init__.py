"""The thin CLI: click commands that turn options into library calls and render the results."""
