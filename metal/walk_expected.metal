// DFlash2 selector expected walk over a lattice [..., g, P, K] float32, calibration a float32
// scalar: the path with the most leading drafts accepted in expectation, under
// p_t(b | a) = softmax(lattice[..., t, a, :] / calibration) (a: predecessor row; step 0 row 0).
//   values[..., t, a] = V_t(a) = max_b p_t(b | a) (1 + V_{t+1}(b)), V_g = 0, for every row a
//   choices[..., t]   = that argmax at a = prev (0, then the previous choice)
// values is also the backward pass's scratch: a work item cannot hold arrays of any size.
// The backward pass (i < g, every row) and the forward pass (i >= g, the row of prev) share one
// gain loop, so the forward picks what the backward maximised. NaN as the reference: a row
// holding NaN has NaN probabilities; a NaN gain makes the value NaN (tested as gain != gain,
// MLX builds kernels without fast math; precise::max would drop it); the argmax is the greedy
// walk's (lowest index on ties, NaN never chosen, else 0). Softmax: subtract the row max, exp
// (metal::precise: the unqualified one follows the math mode; MLX's own Metal softmax uses
// fast::exp, so the two differ by ulps, inside the self-check's tolerance), divide by the sum;
// then gain = p * (1 + V) in the reference's order.
// Grid (walks, 1, 1): one walk per work item.
uint n = thread_position_in_grid.x;
int nd = lattice_ndim;
uint K = uint(lattice_shape[nd - 1]);
uint P = uint(lattice_shape[nd - 2]);
uint steps = uint(lattice_shape[nd - 3]);
float calib = calibration;
uint prev = 0u;
for (uint i = 0u; i < 2u * steps; ++i) {
  bool back = i < steps;
  uint t = back ? steps - 1u - i : i - steps;
  uint first = back ? 0u : prev;
  uint last = back ? P : prev + 1u;
  uint later = (n * steps + t + 1u) * P;  // V_{t+1}, read only when t + 1 < steps
  for (uint a = first; a < last; ++a) {
    uint row = ((n * steps + t) * P + a) * K;
    float m = -INFINITY;
    for (uint b = 0u; b < K; ++b) {
      float z = lattice[row + b] / calib;
      if (z > m) {
        m = z;
      }
    }
    float total = 0.0f;
    for (uint b = 0u; b < K; ++b) {
      total += metal::precise::exp(lattice[row + b] / calib - m);
    }
    uint best = 0u;
    float best_v = -INFINITY;
    float value = -INFINITY;
    for (uint b = 0u; b < K; ++b) {
      float p = metal::precise::exp(lattice[row + b] / calib - m) / total;
      float gain = p * (1.0f + (t + 1u < steps ? values[later + b] : 0.0f));
      if (gain > best_v) {
        best = b;
        best_v = gain;
      }
      if (gain > value || gain != gain) {
        value = gain;
      }
    }
    if (back) {
      values[(n * steps + t) * P + a] = value;
    } else {
      choices[n * steps + t] = int32_t(best);
      prev = best;
    }
  }
}
