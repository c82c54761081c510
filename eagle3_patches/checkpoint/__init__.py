"""Checkpoint tools: read, check and convert EAGLE-3 draft and target checkpoints.

Nothing here imports sglang; torch is imported only to read a draft's ``d2t`` / ``t2d``.

* :mod:`.safe_io` - the one way a checkpoint file is opened and parsed (no links out, no
  special files, bounded reads and JSON parses; docs/security.md)
* :mod:`.terminal` - the one escaping helper for untrusted strings on the terminal
* :mod:`.safetensors_header` - read / validate / write safetensors headers (no tensor data)
* :mod:`.formats` - config.json and index reading, SGLang vs speculators format, typed views
* :mod:`.layer_ids` - the two layer-id conventions and what an id captures on each sglang release
* :mod:`.releases` - the sglang release table as data; which patch covers which release
* :mod:`.launch_args` - parse ``sglang.launch_server`` flags or whole launch commands
* :mod:`.d2t` - the ``d2t`` validator (shared with the strict-loading patch)
* :mod:`.doctor` - the preflight doctor (docs/doctor.md)
* :mod:`.convert` - speculators -> SGLang converter (docs/checkpoints.md)
* :mod:`.draft_kind` - "is this an EAGLE-3 draft?" for the algorithm guard
"""
