/* dflash2's CBLAS front, loaded before MLX (dflash2_mlx/_blas.py compiles it once).

   MLX resolves cblas_sgemm / cblas_dgemm / cblas_cgemm dynamically: these definitions win and
   forward to the OpenBLAS that _blas.py found (pointers given by dflash2_cblas_init).

   One case is computed here instead: C = A @ B^T with few rows of A (row-major, alpha 1,
   beta 0) -- every linear layer of a decode step or a verify of a few tokens. OpenBLAS's gemm
   packs the whole weight B on each such call; this kernel streams each row of B once and
   dots it with every row of A, so a product costs about one read of the weight at a few rows.
   Where asked (split), the products it does not take go to OpenBLAS in chunks over the pool.
   Each output is summed in the same order whatever the number of rows (up to the cap), so a
   row's product does not depend on the rows beside it, nor on how many threads share the
   product (dflash2_cblas_init's `threads`: chunks of B's rows taken by a small pool of helper
   threads and the caller). Built with -DDFLASH2_FORWARD_ONLY (a compiler without these
   intrinsics), it only forwards. */

#define _GNU_SOURCE
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
static int skinny_threads_n = 1; /* threads a product is split over */
static int split_large; /* products of more rows: OpenBLAS on chunks over the pool */
#define POOL_MAX 16

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

/* ---- threads: a product's rows of B split into chunks that a pool of helpers and the caller
   take in turn (a helper descheduled on a busy machine delays at most the chunk it holds) ---- */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define POOL_MIN_WORK (1 << 16) /* n * k below this: one thread (a handoff costs more) */
#define POOL_CHUNK_ROWS 64      /* at least this many rows of B a chunk */
/* A helper spins this long for the next product, then sleeps: most gaps between a forward's
   products are shorter. Measured at 2 threads on 2 cores: with 1 ms, a forward took 1.35x as
   long as at one thread while another process kept a core busy; with 50 us it stayed faster. */
#define POOL_SPIN_NS 50000
#define POOL_CALLER_SPINS 2000 /* pauses the caller waits for the last chunks, then sleeps */
/* linux/futex.h's FUTEX_WAIT_PRIVATE and FUTEX_WAKE_PRIVATE (not included: kernel headers are
   not everywhere a C compiler is) */
enum { FUTEX_WAIT_P = 0 | 128, FUTEX_WAKE_P = 1 | 128 };

struct pool_job {
  int level, m, n, k, lda, ldb, ldc, rows; /* level 0: OpenBLAS's gemm; rows of B (columns of C)
                                             a chunk */
  const float *a, *b;
  float *c;
  int ta, tb; /* OpenBLAS's jobs: op(A) @ op(B) * alpha + C * beta */
  float alpha, beta;
};
static struct pool_job pool_job;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER; /* one product at a time */
static int pool_helpers;              /* helper threads running in this process */
static _Atomic uint64_t pool_ticket;  /* job number << 32 | chunks << 16 | next chunk */
static _Atomic uint32_t pool_number;  /* the job number, as a futex word */
static _Atomic int pool_done;         /* chunks of the current job finished */
static _Atomic int pool_sleepers;
static _Atomic int pool_caller_asleep;  /* the caller sleeps until pool_done is complete */
static _Atomic long pool_helper_chunks; /* chunks helpers took (tests: the pool works) */
static int pool_cannot_grow;            /* a helper could not be started: none more tried */

static void pool_chunk(const struct pool_job *j, int i) {
  int n0 = i * j->rows, nb = j->n - n0 < j->rows ? j->n - n0 : j->rows;
  if (j->level) {
    skinny(j->level, j->m, nb, j->k, j->a, j->lda, j->b + (size_t)n0 * j->ldb, j->ldb, j->c + n0,
           j->ldc);
    return;
  } /* columns n0.. of op(B): rows of B stored n x k (TRANS), else its columns */
  const float *b = j->tb == TRANS ? j->b + (size_t)n0 * j->ldb : j->b + n0;
  next_sgemm(ROW_MAJOR, j->ta, j->tb, j->m, nb, j->k, j->alpha, j->a, j->lda, b, j->ldb, j->beta,
             j->c + n0, j->ldc);
}

/* Take and compute chunks of job `number` while it has any left. A chunk is claimed by
   advancing the ticket, so the job (and pool_job) stays in place until it is done. */
static void pool_work(uint32_t number, int helper) {
  uint64_t t = atomic_load_explicit(&pool_ticket, memory_order_acquire);
  int chunks = (int)((t >> 16) & 0xffff);
  while ((uint32_t)(t >> 32) == number && (int)(t & 0xffff) < chunks) {
    if (!atomic_compare_exchange_weak_explicit(&pool_ticket, &t, t + 1, memory_order_acq_rel,
                                               memory_order_acquire))
      continue;
    pool_chunk(&pool_job, (int)(t & 0xffff));
    if (helper) atomic_fetch_add_explicit(&pool_helper_chunks, 1, memory_order_relaxed);
    if (atomic_fetch_add(&pool_done, 1) + 1 == chunks && atomic_load(&pool_caller_asleep))
      syscall(SYS_futex, &pool_done, FUTEX_WAKE_P, 1, NULL, NULL, 0);
    t = atomic_load_explicit(&pool_ticket, memory_order_acquire);
  }
}

/* The caller, its own chunks done, waits for the helpers' last ones: it spins briefly, then
   sleeps (a helper descheduled mid-chunk on a busy machine then gets the caller's core). */
static void pool_wait(int chunks) {
  for (int spins = 0;; spins++) {
    int done = atomic_load(&pool_done);
    if (done >= chunks) break;
    if (spins < POOL_CALLER_SPINS) {
      _mm_pause();
      continue;
    }
    atomic_store(&pool_caller_asleep, 1);
    done = atomic_load(&pool_done);
    if (done >= chunks) break;
    struct timespec limit = {0, 1000000}; /* a lost wake-up costs at most 1 ms */
    syscall(SYS_futex, &pool_done, FUTEX_WAIT_P, done, &limit, NULL, 0);
  }
  atomic_store(&pool_caller_asleep, 0);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *pool_helper(void *arg) {
  uint32_t seen = (uint32_t)(uintptr_t)arg;
  for (;;) {
    int64_t since = now_ns();
    uint32_t number;
    for (int spins = 0;
         (number = atomic_load_explicit(&pool_number, memory_order_acquire)) == seen;) {
      _mm_pause();
      if (++spins % 256 || now_ns() - since < POOL_SPIN_NS) continue;
      atomic_fetch_add(&pool_sleepers, 1);
      syscall(SYS_futex, &pool_number, FUTEX_WAIT_P, seen, NULL, NULL, 0);
      atomic_fetch_sub(&pool_sleepers, 1);
      since = now_ns();
    }
    seen = number;
    pool_work(number, 1);
  }
  return NULL;
}

static void pool_forget(void) { /* a forked child has none of the parent's helpers */
  pool_helpers = pool_cannot_grow = 0;
  pthread_mutex_init(&pool_lock, NULL);
  atomic_store(&pool_sleepers, 0);
}

static void pool_grow(int helpers) {
  static int registered;
  if (!registered) registered = !pthread_atfork(NULL, NULL, pool_forget);
  while (pool_helpers < helpers && !pool_cannot_grow) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    uintptr_t number = atomic_load(&pool_number);
    int failed = pthread_create(&t, &attr, pool_helper, (void *)number);
    pthread_attr_destroy(&attr);
    if (failed) { /* fewer helpers: the caller takes more chunks */
      pool_cannot_grow = 1;
      break;
    }
    pool_helpers++;
  }
}

/* A job's chunks over `threads` threads (this one and pool helpers); all by this one while
   another thread's product has the pool. */
static void pool_run(struct pool_job job, int threads) {
  int chunks = (job.n + job.rows - 1) / job.rows;
  if (threads < 2 || pthread_mutex_trylock(&pool_lock)) {
    for (int i = 0; i < chunks; i++) pool_chunk(&job, i);
    return;
  }
  pool_grow(threads - 1);
  pool_job = job;
  atomic_store_explicit(&pool_done, 0, memory_order_relaxed);
  uint32_t number = atomic_load(&pool_number) + 1;
  atomic_store_explicit(&pool_ticket, (uint64_t)number << 32 | (uint64_t)chunks << 16,
                        memory_order_release);
  atomic_store(&pool_number, number); /* seq_cst: before the sleepers are counted */
  if (atomic_load(&pool_sleepers))
    syscall(SYS_futex, &pool_number, FUTEX_WAKE_P, INT_MAX, NULL, NULL, 0);
  pool_work(number, 0);
  pool_wait(chunks);
  pthread_mutex_unlock(&pool_lock);
}

/* The kernel over `threads` threads where the product is large enough, else alone. Every
   output is computed by the same code in the same order whichever thread takes it. */
static void skinny_threads(int level, int threads, int m, int n, int k, const float *a, int lda,
                           const float *b, int ldb, float *c, int ldc) {
  int rows = (n + 4 * threads - 1) / (4 * threads); /* ~4 chunks a thread */
  rows = rows < POOL_CHUNK_ROWS ? POOL_CHUNK_ROWS : (rows + 15) & ~15;
  int chunks = (n + rows - 1) / rows;
  if (threads < 2 || chunks < 2 || chunks > 0xffff || (long)n * k < POOL_MIN_WORK) {
    skinny(level, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  struct pool_job job = {level, m, n, k, lda, ldb, ldc, rows, a, b, c, NO_TRANS, TRANS, 1, 0};
  pool_run(job, threads);
}

/* A product the kernel does not take (more rows, or another layout: training's backward
   passes), where OpenBLAS runs one thread: OpenBLAS's gemm on chunks of C's columns over the
   pool (a prefill's products: 1.8x at 512 rows on 2 cores), without OpenBLAS's own threads,
   which spin-wait and made a decode step 5x slower beside another busy process. The chunks
   depend on the shape alone, so the product is the same at any thread count and while the
   pool is busy. Row-major, ta and tb NO_TRANS or TRANS, legal strides. */
#define SPLIT_CHUNKS 8           /* most chunks of C's columns a product is cut into */
#define SPLIT_COLUMNS 128        /* a chunk per this many columns (even chunks: 257 -> 3) */
#define SPLIT_MIN_WORK (1 << 22) /* m * n * k below this: OpenBLAS whole */
static void split_threads(int threads, int ta, int tb, int m, int n, int k, float alpha,
                          const float *a, int lda, const float *b, int ldb, float beta, float *c,
                          int ldc) {
  int chunks = (n + SPLIT_COLUMNS - 1) / SPLIT_COLUMNS;
  chunks = chunks > SPLIT_CHUNKS ? SPLIT_CHUNKS : chunks;
  int columns = ((n + chunks - 1) / chunks + 15) & ~15; /* a chunk's, whole vectors */
  if ((double)m * n * k < SPLIT_MIN_WORK || n <= columns) {
    next_sgemm(ROW_MAJOR, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  struct pool_job job = {0, m, n, k, lda, ldb, ldc, columns, a, b, c, ta, tb, alpha, beta};
  pool_run(job, threads);
}

/* Row-major, each op NO_TRANS or TRANS, positive sizes and strides no shorter than rows. */
static int plain_layout(int o, int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc) {
  return o == ROW_MAJOR && (ta == NO_TRANS || ta == TRANS) && (tb == NO_TRANS || tb == TRANS) &&
         m >= 1 && n >= 1 && k >= 1 && lda >= (ta == TRANS ? m : k) &&
         ldb >= (tb == TRANS ? k : n) && ldc >= n;
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
   widest instructions up to `max_level` (0 none, 1 AVX2 + FMA, 2 AVX-512) this CPU has, over
   `threads` threads; `split`: larger products go to OpenBLAS in chunks over those threads
   (where OpenBLAS runs one). Returns the level in use. */
int dflash2_cblas_init(void *sgemm, void *dgemm, void *cgemm, int max_rows, int max_level,
                       int threads, int split) {
  next_sgemm = (sgemm_fn)sgemm;
  next_dgemm = (dgemm_fn)dgemm;
  next_cgemm = (cgemm_fn)cgemm;
  skinny_max_rows = max_rows;
  skinny_level = max_rows > 0 ? best_level(max_level) : 0;
  skinny_threads_n = threads < 1 ? 1 : threads > POOL_MAX ? POOL_MAX : threads;
  split_large = skinny_level && split && skinny_threads_n > 1;
  return skinny_level;
}

/* The kernel alone at a level over `threads` threads, for tests: the level used, or -1 where
   this CPU lacks it. */
int dflash2_skinny_sgemm(int max_level, int threads, int m, int n, int k, const float *a,
                         int lda, const float *b, int ldb, float *c, int ldc) {
#if defined(__x86_64__) && !defined(DFLASH2_FORWARD_ONLY)
  int level = best_level(max_level);
  threads = threads < 1 ? 1 : threads > POOL_MAX ? POOL_MAX : threads;
  if (level > 0) return skinny_threads(level, threads, m, n, k, a, lda, b, ldb, c, ldc), level;
#endif
  (void)max_level, (void)threads, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b;
  (void)ldb, (void)c, (void)ldc;
  return -1;
}

/* A product through OpenBLAS in chunks over `threads` threads, for tests: 0, -2 where the
   layout is not one split_threads takes, or -1 where this build has no pool. */
int dflash2_split_sgemm(int threads, int ta, int tb, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta, float *c,
                        int ldc) {
#if defined(__x86_64__) && !defined(DFLASH2_FORWARD_ONLY)
  if (!next_sgemm) return -1;
  if (!plain_layout(ROW_MAJOR, ta, tb, m, n, k, lda, ldb, ldc)) return -2;
  threads = threads < 1 ? 1 : threads > POOL_MAX ? POOL_MAX : threads;
  split_threads(threads, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return 0;
#else
  (void)threads, (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
  (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
  return -1;
#endif
}

/* Chunks of products that pool helpers computed so far (tests: the threads do share work). */
long dflash2_pool_helper_chunks(void) {
#if defined(__x86_64__) && !defined(DFLASH2_FORWARD_ONLY)
  return atomic_load(&pool_helper_chunks);
#else
  return 0;
#endif
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
  /* illegal strides go on to OpenBLAS, which reports them */
  if (skinny_level && plain_layout(o, ta, tb, m, n, k, lda, ldb, ldc)) {
    if (ta == NO_TRANS && tb == TRANS && al == 1.0f && be == 0.0f && m <= skinny_max_rows) {
      skinny_threads(skinny_level, skinny_threads_n, m, n, k, a, lda, b, ldb, c, ldc);
      return;
    }
    if (split_large) {
      split_threads(skinny_threads_n, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
      return;
    }
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
