"""A Citus cluster on this machine, and a drive of real workers against it."""
