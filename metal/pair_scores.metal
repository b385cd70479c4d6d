// DFlash2 selector pair scores (spec 4.2) for every drafted row n = (leading..., t):
//
//   scores[n, p, k] = unary[n, k] + sum_j pred_rows[n, p, j] * hidden[n, j] * succ_rows[n, k, j]
//
// unary [..., g, K]; hidden [..., g, R]; pred_rows [..., g, P, R]; succ_rows [..., g, K, R];
// scores [..., g, P, K] float32. Inputs may be float, float16_t or bfloat16_t each (read as
// float). Template: TU, TH, TP, TS = those element types; the generated signature already
// carries them, the template only gives each dtype combination its own kernel name.
// Grid (K, P, rows): one score per work item; the rank sum is a float fma chain (any R).
uint k = thread_position_in_grid.x;
uint p = thread_position_in_grid.y;
uint n = thread_position_in_grid.z;
uint K = uint(unary_shape[unary_ndim - 1]);
uint R = uint(hidden_shape[hidden_ndim - 1]);
uint P = uint(pred_rows_shape[pred_rows_ndim - 2]);
uint h0 = n * R;
uint p0 = (n * P + p) * R;
uint s0 = (n * K + k) * R;
float acc = 0.0f;
for (uint j = 0u; j < R; ++j) {
  acc = metal::fma(float(pred_rows[p0 + j]) * float(hidden[h0 + j]), float(succ_rows[s0 + j]), acc);
}
scores[(n * P + p) * K + k] = float(unary[n * K + k]) + acc;
