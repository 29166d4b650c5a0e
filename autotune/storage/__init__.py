"""Where studies live: Optuna RDB storages (``_rdb``: SQLite in WAL mode, PostgreSQL), the
retrying of calls to a database that stops answering for a while (``_outage``), the heartbeat of
running trials and the study's lock (``_liveness``), what a trial and a study record
(``_records``) and what other modules ask of them (``_queries``), the memory walls trials and
stage 1 share (``_walls``), and ``adapter``, the one place that reaches past Optuna's public
API.
"""
