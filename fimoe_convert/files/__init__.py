"""Everything that opens a file (tests/cli/test_layering.py flags file access anywhere else in the package,
`testing` aside):

- `names`: the file names SRC and OUT share (index, manifest, lock, temporaries);
- `st_header`, `st_reader`, `st_writer`: safetensors headers (strict validation), tensor reads, the streaming
  shard writer; `atomic`: files written whole through a temporary name, and the temporaries' registry;
- `source`: SRC, a local folder or a Hub snapshot, validated before any tensor data is read; `hub_source`: all
  reading from the Hub (SRC resolved and downloaded, shard headers read without the weights);
- `output`: OUT, its manifest and status files, the checks before a conversion, verification; `lock`: OUT's lock;
- `hashing`: sha256 of files, many at once; `jsonfile`: the one strict JSON loader; `paths`: the one path rule;
- `preset`: conversion presets (`--config FILE`)."""
