// DFlash2 two-tap grouped dynamic convolution over block rows (spec 4.1), one side: the same
// body serves `prepare` (side 0 coefficients) and `finish` (side 1).
//
//   out[r, c] = (base[0, c] + dynamic[r, 0, c / GROUP]) * x[r, c]
//             + (base[1, c] + dynamic[r, 1, c / GROUP]) * x[r - 1, c]     (only when t > 0)
//
// x, out : [..., L, H] row-major; rows r run over (leading..., t) and t = r % L is the block
//          position, so tap 1 never crosses a block start (row t - 1 < 0 reads zero).
// dynamic: [..., L, 2, H / GROUP] (dtype T); base: [2, H] (already cast to T by the caller).
// Template: T = float, float16_t or bfloat16_t; GROUP = channels sharing one coefficient.
// Grid (H, rows, 1): one output element per work item. Arithmetic in float, rounded to T once.
uint c = thread_position_in_grid.x;
uint r = thread_position_in_grid.y;
uint H = uint(x_shape[x_ndim - 1]);
uint L = uint(x_shape[x_ndim - 2]);
uint G = H / uint(GROUP);
uint g = c / uint(GROUP);
uint i = r * H + c;
uint d = r * 2u * G + g;
float acc = (float(base[c]) + float(dynamic[d])) * float(x[i]);
if (r % L != 0u) {
  acc = metal::fma(float(base[H + c]) + float(dynamic[d + G]), float(x[i - H]), acc);
}
out[i] = static_cast<T>(acc);
