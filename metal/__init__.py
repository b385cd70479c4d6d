"""Metal kernel bodies for dflash2 (shipped as package data of `dflash2_mlx.kernels.metal`).

Each `*.metal` file is a kernel BODY for `mx.fast.metal_kernel`: MLX writes the signature from
the input/output names, their dtypes and the template arguments. The names, templates and grid of
each body are declared once in `dflash2_mlx/kernels/_specs.py` and `_launch.py`.
"""
