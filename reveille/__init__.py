"""The application shell: CLI, settings and the composition of `reveille serve`."""
