"""Everything that opens a file (tests/cli/test_layering.py flags file access anywhere else in the package,
`testing` aside), by job:

- `safetensors/`: the format: `header` (strict validation, the header bytes of a file to write), `reader` (tensor
  reads from a validated file), `writer` (the streaming shard writer);
- `output/`: the output folder: `manifest` (the manifest file and the per-rank status files), `lock` (OUT's lock),
  `atomic` (files written whole through a temporary name, and the temporaries' registry), `space` (what
  `--overwrite` frees), `folder` (OUT's checks before a conversion, clearing, copying SRC's small files, verify,
  tensor reads);
- `sources/`: SRC: `local` (a folder or a Hub snapshot, validated before any tensor data is read), `hub` (resolving
  and downloading a repo id, shard headers read without the weights), `stream` (--stream), `http_range` (the
  one resuming ranged reader: --stream's shards, the headers `hub` reads);
- here, the rules every job shares: `names` (the file names SRC and OUT share), `paths` (the one rule for a name read
  from a file), `safe_open` (regular files only), `jsonfile` (the one strict JSON loader), `hashing` (sha256 of
  files, many at once), `preset` (conversion presets, `--config`)."""
