// DFlash2 selector sampled walk (spec 4.2) over a lattice [..., g, P, K] float32, with the
// randomness given: uniforms [..., g, K] float32 in (0, 1), temperature a float32 scalar.
// Per step, logits = lattice[row] / temperature (row: anchor row 0, then the previous choice);
//   q[..., t, :]   = softmax(logits)
//   choices[..., t] = argmax_k(logits[k] - log(-log(uniforms[..., t, k])))    (Gumbel-max)
// an exact sample of q (mx.random.categorical samples batched distributions the same way).
// The argmax is the greedy walk's (lowest index on ties, NaN never chosen, else 0).
// exp / log are metal::precise: the unqualified names follow the library's math mode (fast
// by default on macOS 15). The Gumbel draws match the reference's (MLX's log is precise); its
// q comes from MLX's softmax, whose Metal kernel uses fast::exp: q differs by ulps, inside the
// self-check's tolerance.
// Grid (walks, 1, 1): one walk per work item.
uint n = thread_position_in_grid.x;
int nd = lattice_ndim;
uint K = uint(lattice_shape[nd - 1]);
uint P = uint(lattice_shape[nd - 2]);
uint steps = uint(lattice_shape[nd - 3]);
float temp = temperature;
uint prev = 0u;
for (uint t = 0u; t < steps; ++t) {
  uint row = ((n * steps + t) * P + prev) * K;
  uint out_row = (n * steps + t) * K;
  float m = -INFINITY;
  for (uint k = 0u; k < K; ++k) {
    float logit = lattice[row + k] / temp;
    if (logit > m) {
      m = logit;
    }
  }
  float total = 0.0f;
  for (uint k = 0u; k < K; ++k) {
    total += metal::precise::exp(lattice[row + k] / temp - m);
  }
  uint best = 0u;
  float best_v = -INFINITY;
  for (uint k = 0u; k < K; ++k) {
    float logit = lattice[row + k] / temp;
    q[out_row + k] = metal::precise::exp(logit - m) / total;
    float v = logit - metal::precise::log(-metal::precise::log(uniforms[out_row + k]));
    if (v > best_v) {
      best = k;
      best_v = v;
    }
  }
  choices[n * steps + t] = int32_t(best);
  prev = best;
}
