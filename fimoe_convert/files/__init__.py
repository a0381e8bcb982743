"""Everything that opens a file (tests/cli/test_layering.py flags file access anywhere else in the package,
`testing` aside):

- `safetensors`: strict header validation, raw tensor reads, the streaming shard writer, atomic small files;
- `source`: SRC, a local folder or a Hub snapshot, validated before any tensor data is read;
- `output`: OUT, its manifest and status files, the checks before a conversion, verification;
- `preset`: conversion presets (`--config FILE`)."""
