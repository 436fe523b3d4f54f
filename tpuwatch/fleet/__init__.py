"""Many jobs in one watcher: `watch`/`check` with several `-c` or a `--config-dir`.

- `sources.py`: which config files there are, and which changed since the last look.
- `runner.py`: one thread per job running the usual tick loop (tpuwatch/loop.py) with the
  job's own journal and lock, sharing the TPU API's and Compute Engine's listings per zone, the
  audit-log cache per project, a bounded number of tick slots and one metrics endpoint; the
  exit code of the lot.
A single `-c` does not come here: it runs exactly as `watch` always did.
"""
