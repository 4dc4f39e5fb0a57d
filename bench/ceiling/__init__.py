"""The measured ceiling of one PostgreSQL: its CPU, commits, WAL and bytes per task."""
