"""Write a real-format tiny DeepSeek V4 checkpoint: python3 scripts/make_fixture.py OUT [--preset tiny|flash-geometry]."""

import argparse

from fimoe_convert.testing import PRESETS, make_checkpoint

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("out")
p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--layers", type=int, default=None, help="override the preset's number of layers")
p.add_argument("--experts", type=int, default=None)
args = p.parse_args()
overrides = {k: v for k, v in {"seed": args.seed, "layers": args.layers, "experts": args.experts}.items() if v is not None}
print(make_checkpoint(args.out, args.preset, **overrides))
