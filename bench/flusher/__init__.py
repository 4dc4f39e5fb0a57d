"""The node flusher's CPU per task alone: see ``__main__``."""
