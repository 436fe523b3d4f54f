"""The job on the workers: probe, launch, stop and follow it over SSH (the `Workers` port,
sshworkers.py). This package knows nothing of the TPU API, the journal or the recovery policy."""
