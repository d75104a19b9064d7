"""python -m archs [--json]: the zoo's presets with their true parameter counts and FLOPs/token.

`--json` prints the table that archs/presets.json holds for torch-free readers (`pack stats`
recommends presets from it); a test keeps that file equal to this output.
"""

import json
import sys

from archs import list_models

models = list_models()
if "--json" in sys.argv[1:]:
    print(json.dumps(models, indent=2))
else:
    print(f"{'name':<18}{'family':<11}{'parameters':>15}{'active':>15}{'GFLOPs/token @2048':>21}")
    for m in models:
        print(f"{m['name']:<18}{m['family']:<11}{m['params']:>15,}{m['active_params']:>15,}"
              f"{m['flops_per_token'] / 1e9:>21.2f}")
