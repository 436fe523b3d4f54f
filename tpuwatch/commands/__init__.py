"""One module per CLI command; each exposes a click command named `command`.

They are imported only when their command runs, so `tpuwatch --help` stays fast.
"""
