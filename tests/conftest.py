import sys
from pathlib import Path

import dflash2_mlx  # noqa: F401  (binds the optimized BLAS before MLX loads)

sys.path.insert(0, str(Path(__file__).parent))
