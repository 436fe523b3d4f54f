"""Terminal and JSON rendering of tpuwatch's model values (rich panels, JSON-ready dicts).

Rendering only: these modules take `tpuwatch.model` values and a `now`, and never call an API,
read a clock or a journal. `node.py` holds the node panel the status command prints and the
live dashboard reuses; `serialize.py` holds the JSON shapes (docs/status-json.md).
"""
