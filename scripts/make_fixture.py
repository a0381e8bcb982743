"""Write a real-format DeepSeek V4 checkpoint (the one generator, fimoe_convert.testing.make_checkpoint):
python3 scripts/make_fixture.py DIR --preset NAME [--sparse]. "tiny" loads in transformers; "v4-flash" and
"v4-pro" with --sparse are the releases' tensor inventories and shards (headers, data left as holes)."""

import argparse

from fimoe_convert.testing import PRESETS, make_checkpoint

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("out")
p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
p.add_argument("--sparse", action="store_true", help="shards hold their headers and a hole of the data's size")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--layers", type=int, default=None, help="override the preset's number of layers")
p.add_argument("--experts", type=int, default=None)
p.add_argument("--inter", type=int, default=None, help="override the routed/shared experts' intermediate size")
p.add_argument("--index-head-dim", type=int, default=None, help="indexer head size (engines' kernels take 128 only)")
args = p.parse_args()
given = {"seed": args.seed, "layers": args.layers, "experts": args.experts, "inter": args.inter,
         "index_head_dim": args.index_head_dim}
overrides = {k: v for k, v in given.items() if v is not None}
print(make_checkpoint(args.out, args.preset, sparse=args.sparse, **overrides))
