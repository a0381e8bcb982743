"""Moving bytes: SRC -> host memory -> the target's transform -> OUT, within one byte budget.

- `channels`: the byte budget and the FIFOs between threads;
- `schedule`: the order of work for one output shard, as typed steps (pure);
- `feeder`: a reader and a converter thread feeding one writer lane;
- `lanes`: the writer lanes (several shards written and hashed at once) and their sizing."""
