// DFlash2 selector greedy walk (spec 4.2) over a lattice [..., g, P, K] float32.
// Step 0 scores predecessor row 0 (the anchor); step t > 0 scores the row of the previous
// choice. choices [..., g] int32 = argmax per step: lowest index on ties, NaN never chosen, a
// row of only NaN / -inf picks 0 (Metal's mx.argmax; the reference masks NaN to match on CPU).
// Grid (walks, 1, 1): one whole walk per work item (the walk is sequential in t).
uint n = thread_position_in_grid.x;
int nd = lattice_ndim;
uint K = uint(lattice_shape[nd - 1]);
uint P = uint(lattice_shape[nd - 2]);
uint steps = uint(lattice_shape[nd - 3]);
uint prev = 0u;
for (uint t = 0u; t < steps; ++t) {
  uint row = ((n * steps + t) * P + prev) * K;
  uint best = 0u;
  float best_v = -INFINITY;
  for (uint k = 0u; k < K; ++k) {
    float v = lattice[row + k];
    if (v > best_v) {
      best = k;
      best_v = v;
    }
  }
  choices[n * steps + t] = int32_t(best);
  prev = best;
}
