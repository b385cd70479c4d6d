/* dflash2's CBLAS front, loaded before MLX (dflash2_mlx/_blas.py compiles it once).

   MLX resolves cblas_sgemm / cblas_dgemm / cblas_cgemm dynamically: these definitions win and
   forward to the OpenBLAS that _blas.py found (pointers given by dflash2_cblas_init).

   One case is computed here instead: C = A @ B^T with few rows of A (row-major, alpha 1,
   beta 0) -- every linear layer of a decode step or a verify of a few tokens. OpenBLAS's gemm
   packs the whole weight B on each such call; this kernel streams each row of B once and
   dots it with every row of A, so a product costs about one read of the weight at 1-24 rows.
   Each output is summed in the same order whatever the number of rows (up to the cap), so a
   row's product does not depend on the rows beside it. Built with -DDFLASH2_FORWARD_ONLY (a
   compiler without these intrinsics), it only forwards. */

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);
typedef void (*dgemm_fn)(int, int, int, int, int, int, double, const double *, int,
                         const double *, int, double, double *, int);
typedef void (*cgemm_fn)(int, int, int, int, int, int, const void *, const void *, int,
                         const void *, int, const void *, void *, int);

static sgemm_fn next_sgemm;
static dgemm_fn next_dgemm;
static cgemm_fn next_cgemm;
static int skinny_level; /* 0: off, 1: AVX2 + FMA, 2: AVX-512 */
static int skinny_max_rows;

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

#if defined(__x86_64__) && !defined(DFLASH2_FORWARD_ONLY)
#include <immintrin.h>

#define NB512 4 /* rows of B a block streams at once */
/* One step of 16 columns of k: mg rows of A against nb rows of B, into acc. */
#define STEP512(LOAD)                                                                 \
  do {                                                                                \
    __m512 bv[NB512];                                                                 \
    for (int j = 0; j < NB512; j++)                                                   \
      bv[j] = j < nb ? LOAD(b + (size_t)j * ldb + kk) : _mm512_setzero_ps();          \
    for (int j = 0; j < NB512; j++) /* the next block's rows meanwhile: 1.35x at 4 */ \
      _mm_prefetch((const char *)(b + (size_t)(j + NB512) * ldb + kk), _MM_HINT_T0);  \
    for (int i = 0; i < mg; i++) {                                                    \
      __m512 av = LOAD(a + (size_t)i * lda + kk);                                     \
      for (int j = 0; j < NB512; j++) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]); \
    }                                                                                 \
  } while (0)
#define FULL512(P) _mm512_loadu_ps(P)
#define TAIL512(P) _mm512_maskz_loadu_ps(tail, P)

__attribute__((target("avx512f"), always_inline)) static inline void block512(
    int mg, int nb, int k, const float *a, int lda, const float *b, int ldb, float *c,
    int ldc) {
  __m512 acc[4][NB512];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < NB512; j++) acc[i][j] = _mm512_setzero_ps();
  int kk = 0;
  for (; kk + 16 <= k; kk += 16) STEP512(FULL512);
  if (kk < k) {
    __mmask16 tail = (__mmask16)((1u << (k - kk)) - 1);
    STEP512(TAIL512);
  }
  for (int i = 0; i < mg; i++)
    for (int j = 0; j < nb; j++) c[(size_t)i * ldc + j] = _mm512_reduce_add_ps(acc[i][j]);
}

__attribute__((target("avx512f"))) static void skinny512(int m, int n, int k, const float *a,
                                                          int lda, const float *b, int ldb,
                                                          float *c, int ldc) {
  for (int n0 = 0; n0 < n; n0 += NB512) {
    int nb = n - n0 < NB512 ? n - n0 : NB512;
    const float *bn = b + (size_t)n0 * ldb;
    for (int m0 = 0; m0 < m; m0 += 4) {
      const float *am = a + (size_t)m0 * lda;
      float *cm = c + (size_t)m0 * ldc + n0;
      switch (m - m0 < 4 ? m - m0 : 4) { /* a constant row count keeps acc in registers */
        case 1: block512(1, nb, k, am, lda, bn, ldb, cm, ldc); break;
        case 2: block512(2, nb, k, am, lda, bn, ldb, cm, ldc); break;
        case 3: block512(3, nb, k, am, lda, bn, ldb, cm, ldc); break;
        default: block512(4, nb, k, am, lda, bn, ldb, cm, ldc); break;
      }
    }
  }
}

#define NB256 2
__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#define STEP256(LOAD)                                                                 \
  do {                                                                                \
    __m256 bv[NB256];                                                                 \
    for (int j = 0; j < NB256; j++)                                                   \
      bv[j] = j < nb ? LOAD(b + (size_t)j * ldb + kk) : _mm256_setzero_ps();          \
    for (int j = 0; j < NB256; j++)                                                   \
      _mm_prefetch((const char *)(b + (size_t)(j + NB256) * ldb + kk), _MM_HINT_T0);  \
    for (int i = 0; i < mg; i++) {                                                    \
      __m256 av = LOAD(a + (size_t)i * lda + kk);                                     \
      for (int j = 0; j < NB256; j++) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]); \
    }                                                                                 \
  } while (0)
#define FULL256(P) _mm256_loadu_ps(P)
#define TAIL256(P) _mm256_maskload_ps(P, tail)

__attribute__((target("avx2,fma"), always_inline)) static inline void block256(
    int mg, int nb, int k, const float *a, int lda, const float *b, int ldb, float *c,
    int ldc) {
  __m256 acc[4][NB256];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < NB256; j++) acc[i][j] = _mm256_setzero_ps();
  int kk = 0;
  for (; kk + 8 <= k; kk += 8) STEP256(FULL256);
  if (kk < k) {
    __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(k - kk),
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    STEP256(TAIL256);
  }
  for (int i = 0; i < mg; i++)
    for (int j = 0; j < nb; j++) c[(size_t)i * ldc + j] = hsum256(acc[i][j]);
}

__attribute__((target("avx2,fma"))) static void skinny256(int m, int n, int k, const float *a,
                                                           int lda, const float *b, int ldb,
                                                           float *c, int ldc) {
  for (int n0 = 0; n0 < n; n0 += NB256) {
    int nb = n - n0 < NB256 ? n - n0 : NB256;
    const float *bn = b + (size_t)n0 * ldb;
    for (int m0 = 0; m0 < m; m0 += 4) {
      const float *am = a + (size_t)m0 * lda;
      float *cm = c + (size_t)m0 * ldc + n0;
      switch (m - m0 < 4 ? m - m0 : 4) {
        case 1: block256(1, nb, k, am, lda, bn, ldb, cm, ldc); break;
        case 2: block256(2, nb, k, am, lda, bn, ldb, cm, ldc); break;
        case 3: block256(3, nb, k, am, lda, bn, ldb, cm, ldc); break;
        default: block256(4, nb, k, am, lda, bn, ldb, cm, ldc); break;
      }
    }
  }
}

/* The kernel at `level` (1: AVX2 + FMA, 2: AVX-512). */
static void skinny(int level, int m, int n, int k, const float *a, int lda, const float *b,
                   int ldb, float *c, int ldc) {
  if (level == 2)
    skinny512(m, n, k, a, lda, b, ldb, c, ldc);
  else
    skinny256(m, n, k, a, lda, b, ldb, c, ldc);
}

static int cpu_level(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 2;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
  return 0;
}
#else
static int cpu_level(void) { return 0; }
#endif

static int best_level(int max_level) {
  int level = cpu_level();
  return level < max_level ? level : max_level;
}

/* Set the forwarding targets and the kernel: products of up to `max_rows` rows, with the
   widest instructions up to `max_level` (0 none, 1 AVX2 + FMA, 2 AVX-512) this CPU has.
   Returns the level in use. */
int dflash2_cblas_init(void *sgemm, void *dgemm, void *cgemm, int max_rows, int max_level) {
  next_sgemm = (sgemm_fn)sgemm;
  next_dgemm = (dgemm_fn)dgemm;
  next_cgemm = (cgemm_fn)cgemm;
  skinny_max_rows = max_rows;
  skinny_level = max_rows > 0 ? best_level(max_level) : 0;
  return skinny_level;
}

/* The kernel alone at a level, for tests: the level used, or -1 where this CPU lacks it. */
int dflash2_skinny_sgemm(int max_level, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc) {
#if defined(__x86_64__) && !defined(DFLASH2_FORWARD_ONLY)
  int level = best_level(max_level);
  if (level > 0) return skinny(level, m, n, k, a, lda, b, ldb, c, ldc), level;
#endif
  (void)max_level, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc;
  return -1;
}

/* Only reachable if the shim were made global before dflash2_cblas_init (_blas.py never
   does): a clear message instead of a jump to address 0. */
static void missing(const char *name) {
  fprintf(stderr, "dflash2 BLAS shim: %s called before dflash2_cblas_init\n", name);
  abort();
}

void cblas_sgemm(int o, int ta, int tb, int m, int n, int k, float al, const float *a, int lda,
                 const float *b, int ldb, float be, float *c, int ldc) {
#if defined(__x86_64__) && !defined(DFLASH2_FORWARD_ONLY)
  if (skinny_level && o == ROW_MAJOR && ta == NO_TRANS && tb == TRANS && al == 1.0f &&
      be == 0.0f && m >= 1 && m <= skinny_max_rows && n >= 1 && k >= 1 && lda >= k &&
      ldb >= k && ldc >= n) { /* illegal strides go on to OpenBLAS, which reports them */
    skinny(skinny_level, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
#endif
  if (!next_sgemm) missing("cblas_sgemm");
  next_sgemm(o, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
}

void cblas_dgemm(int o, int ta, int tb, int m, int n, int k, double al, const double *a, int lda,
                 const double *b, int ldb, double be, double *c, int ldc) {
  if (!next_dgemm) missing("cblas_dgemm");
  next_dgemm(o, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
}

void cblas_cgemm(int o, int ta, int tb, int m, int n, int k, const void *al, const void *a,
                 int lda, const void *b, int ldb, const void *be, void *c, int ldc) {
  if (!next_cgemm) missing("cblas_cgemm");
  next_cgemm(o, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
}
