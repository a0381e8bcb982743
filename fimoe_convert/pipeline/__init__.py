"""Moving bytes: SRC -> host memory -> the target's transform -> OUT, within one byte budget.

- `channels`: the byte budget and the FIFOs between threads;
- `schedule`: the order of work for one output shard, as typed steps (pure);
- `reads`: what the lanes will read from SRC, known before they start: for --stream, which tensors to keep in
  memory until read, and the order the source shards are first needed (pure);
- `feeder`: a reader and a converter thread feeding one writer lane;
- `lanes`: the writer lanes, several shards written and hashed at once (how many, and their bytes: budget.py)."""
