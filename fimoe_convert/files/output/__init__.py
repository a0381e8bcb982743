"""The output folder: its manifest and per-rank status files, the lock, files written whole (`atomic`), the
space `--overwrite` frees, OUT's checks, clearing, copying and verification (`folder`)."""
