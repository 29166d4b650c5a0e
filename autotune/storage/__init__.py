"""Where studies live: Optuna RDB storages, SQLite in WAL mode or PostgreSQL. Its modules:
ARCHITECTURE.md."""
