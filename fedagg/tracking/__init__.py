"""Where results go: files in the run directory always, a live tracker when asked."""
