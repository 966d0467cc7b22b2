"""Gateway: platforms, sessions, wake delivery and the runner."""
