/* The element-wise half of one TOSCA training step ('tosca' flow, cached features, CPU float32), fused.
 *
 * lab/tosca/_fused.py runs the step: its 14 matrix products stay torch's (the same BLAS calls as any
 * implementation), everything between them is one of these kernels, and the L1 + SGD update is one pass
 * over the flat parameter buffer. Row-major contiguous float32 arrays throughout.
 *
 * Numbers: compiled with -ffp-contract=off, so every rounding is the one written here (fmaf where an
 * fma is meant); reductions keep L strided partial sums and fold them in a fixed order, and no loop is
 * split by thread count in a way that changes a sum, so any ISA and any thread count give the same bits.
 * exp and erf are polynomial approximations (Cephes' expf, ~1 ulp; Abramowitz & Stegun 7.1.26, |error|
 * < 1.5e-7, the formula ATen's vectorised erf uses), so results differ from ATen's in the last digits.
 *
 * Threads: T > 1 splits rows (or columns, for column sums) into T contiguous chunks with OpenMP; built
 * without OpenMP the pragmas are ignored and everything runs on one thread. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define L 16 /* partial sums per reduction: one 512-bit vector */
#define SQRT1_2 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f

/* [lo, hi) of chunk t of n items split into T */
static inline void chunk(int t, int T, int64_t n, int64_t *lo, int64_t *hi) {
    int64_t c = (n + T - 1) / T;
    *lo = t * c < n ? t * c : n;
    *hi = *lo + c < n ? *lo + c : n;
}
#define PER_CHUNK(T, n, lo, hi, body)                                                          \
    _Pragma("omp parallel for num_threads(T) schedule(static) if(T > 1)")                    \
    for (int t_ = 0; t_ < T; t_++) { int64_t lo, hi; chunk(t_, T, n, &lo, &hi); body; }

static inline float vexp(float x) { /* Cephes expf, for x clamped to [-87, 88] */
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return p * s;
}

static inline float verf(float x) {
    float a = fabsf(x);
    float t = 1.0f / fmaf(0.3275911f, a, 1.0f);
    float r = fmaf(1.061405429f, t, -1.453152027f);
    r = fmaf(r, t, 1.421413741f);
    r = fmaf(r, t, -0.284496736f);
    r = fmaf(r, t, 0.254829592f);
    return copysignf(1.0f - r * t * vexp(-a * a), x);
}

static inline float fold(float *acc) {
    for (int w = L / 2; w; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

static inline float rowsum(const float *restrict v, int64_t n) {
    float acc[L] = {0};
    int64_t i = 0;
    for (; i + L <= n; i += L)
        for (int j = 0; j < L; j++) acc[j] += v[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += v[i];
    return fold(acc);
}

static inline float rowdot(const float *restrict u, const float *restrict v, int64_t n) {
    float acc[L] = {0};
    int64_t i = 0;
    for (; i + L <= n; i += L)
        for (int j = 0; j < L; j++) acc[j] += u[i + j] * v[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += u[i] * v[i];
    return fold(acc);
}

/* out[c] = sum over rows of a[:, c] for c in [lo, hi), rows in order */
static void colsum(const float *restrict a, float *restrict out, int64_t rows, int64_t cols, int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; c++) out[c] = 0.0f;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = lo; c < hi; c++) out[c] += a[i * cols + c];
}

/* ---- adapter: z1 = x Wd^T + bd (torch), a1 = GELU(z1) --------------------------------------------------- */
static void gelu_fwd_span(const float *restrict z, float *restrict a, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) a[i] = 0.5f * z[i] * (1.0f + verf(z[i] * SQRT1_2));
}
void gelu_fwd(const float *z, float *a, int64_t n, int T) { PER_CHUNK(T, n, lo, hi, gelu_fwd_span(z, a, lo, hi)) }

/* g = dL/da1 -> dL/dz1 in place; gb = its column sums (the down-projection's bias gradient) */
static void gelu_bwd_span(float *restrict g, const float *restrict z, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        float x = z[i];
        float cdf = 0.5f * (1.0f + verf(x * SQRT1_2));
        float pdf = INV_SQRT_2PI * vexp(-0.5f * x * x);
        g[i] = g[i] * (cdf + x * pdf);
    }
}
void gelu_bwd(float *g, const float *z, float *gb, int64_t rows, int64_t cols, int T) {
    PER_CHUNK(T, rows * cols, lo, hi, gelu_bwd_span(g, z, lo, hi))
    PER_CHUNK(T, cols, lo, hi, colsum(g, gb, rows, cols, lo, hi))
}

/* ---- res = u + bu + x (u = a1 Wu^T from torch, in place), h = LayerNorm(res) ----------------------------- */
static void ln_fwd_rows(float *restrict u, const float *restrict b, const float *restrict x, const float *restrict w,
                        const float *restrict beta, float eps, float *restrict h, float *restrict mean,
                        float *restrict rstd, int64_t d, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        float *restrict ri = u + i * d, *restrict hi_ = h + i * d;
        const float *restrict xi = x + i * d;
        for (int64_t c = 0; c < d; c++) ri[c] = (ri[c] + b[c]) + xi[c];
        float mu = rowsum(ri, d) / (float)d;
        float acc[L] = {0};
        int64_t c = 0;
        for (; c + L <= d; c += L)
            for (int j = 0; j < L; j++) { float t = ri[c + j] - mu; acc[j] += t * t; }
        for (int j = 0; c < d; c++, j++) { float t = ri[c] - mu; acc[j] += t * t; }
        float rs = 1.0f / sqrtf(fold(acc) / (float)d + eps);
        mean[i] = mu;
        rstd[i] = rs;
        for (c = 0; c < d; c++) hi_[c] = (ri[c] - mu) * rs * w[c] + beta[c];
    }
}
void ln_fwd(float *u, const float *b, const float *x, const float *w, const float *beta, float eps, float *h,
            float *mean, float *rstd, int64_t rows, int64_t d, int T) {
    PER_CHUNK(T, rows, lo, hi, ln_fwd_rows(u, b, x, w, beta, eps, h, mean, rstd, d, lo, hi))
}

/* g = dL/dh -> gx = dL/dres; gw, gb: the LayerNorm's weight / bias gradients; gbu: column sums of gx
 * (the up-projection's bias gradient: res = u + bu + x) */
static void ln_bwd_rows(const float *restrict g, const float *restrict res, const float *restrict w,
                        const float *restrict mean, const float *restrict rstd, float *restrict gx, int64_t d,
                        int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        const float *restrict gi = g + i * d, *restrict ri = res + i * d;
        float *restrict xi = gx + i * d;
        float mu = mean[i], rs = rstd[i];
        float a1[L] = {0}, a2[L] = {0};
        int64_t c = 0;
        for (; c + L <= d; c += L)
            for (int j = 0; j < L; j++) {
                float dx = gi[c + j] * w[c + j];
                a1[j] += dx;
                a2[j] += dx * ((ri[c + j] - mu) * rs);
            }
        for (int j = 0; c < d; c++, j++) { float dx = gi[c] * w[c]; a1[j] += dx; a2[j] += dx * ((ri[c] - mu) * rs); }
        float m1 = fold(a1) / (float)d, m2 = fold(a2) / (float)d;
        for (c = 0; c < d; c++) xi[c] = rs * ((gi[c] * w[c] - m1) - ((ri[c] - mu) * rs) * m2);
    }
}
static void ln_bwd_cols(const float *restrict g, const float *restrict res, const float *restrict mean,
                        const float *restrict rstd, const float *restrict gx, float *restrict gw, float *restrict gb,
                        float *restrict gbu, int64_t rows, int64_t d, int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; c++) { gw[c] = 0.0f; gb[c] = 0.0f; gbu[c] = 0.0f; }
    for (int64_t i = 0; i < rows; i++) {
        const float *restrict gi = g + i * d, *restrict ri = res + i * d, *restrict xi = gx + i * d;
        float mu = mean[i], rs = rstd[i];
        for (int64_t c = lo; c < hi; c++) {
            gw[c] += gi[c] * ((ri[c] - mu) * rs);
            gb[c] += gi[c];
            gbu[c] += xi[c];
        }
    }
}
void ln_bwd(const float *g, const float *res, const float *w, const float *mean, const float *rstd, float *gx,
            float *gw, float *gb, float *gbu, int64_t rows, int64_t d, int T) {
    PER_CHUNK(T, rows, lo, hi, ln_bwd_rows(g, res, w, mean, rstd, gx, d, lo, hi))
    PER_CHUNK(T, d, lo, hi, ln_bwd_cols(g, res, mean, rstd, gx, gw, gb, gbu, rows, d, lo, hi))
}

/* ---- calibrator: z4 = relu(h Ws1^T) Ws2^T (torch); s = sigmoid(z4) in place; f = h * s; nf2 = |f_i|^2 --- */
static void gate_fwd_rows(float *restrict z, const float *restrict h, float *restrict f, float *restrict nf2,
                          int64_t d, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        float *restrict zi = z + i * d, *restrict fi = f + i * d;
        const float *restrict hi_ = h + i * d;
        for (int64_t c = 0; c < d; c++) {
            float s = 1.0f / (1.0f + vexp(-zi[c]));
            zi[c] = s;
            fi[c] = hi_[c] * s;
        }
        nf2[i] = rowdot(fi, fi, d);
    }
}
void gate_fwd(float *z, const float *h, float *f, float *nf2, int64_t rows, int64_t d, int T) {
    PER_CHUNK(T, rows, lo, hi, gate_fwd_rows(z, h, f, nf2, d, lo, hi))
}

/* g = dL/df -> gz = g h s (1 - s) = dL/dz4; g = g s in place (the product's share of dL/dh) */
static void gate_bwd_span(float *restrict g, const float *restrict h, const float *restrict s, float *restrict gz,
                          int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        float si = s[i], gi = g[i];
        gz[i] = ((gi * h[i]) * (1.0f - si)) * si;
        g[i] = gi * si;
    }
}
void gate_bwd(float *g, const float *h, const float *s, float *gz, int64_t n, int T) {
    PER_CHUNK(T, n, lo, hi, gate_bwd_span(g, h, s, gz, lo, hi))
}

/* g = dL/da3 -> dL/dz3 (a3 = relu(z3)) */
void relu_bwd(float *restrict g, const float *restrict a, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = a[i] > 0.0f ? g[i] : 0.0f;
}

/* ---- the cosine head and its cross-entropy ----------------------------------------------------------------
 * From M = f W^T [N, K] (f: [N, d] LuCA outputs, W: [K, d] class rows): cos = M / (max(|f|, eps) max(|w|, eps))
 * (F.normalize's eps 1e-12), logits = sigma cos, CE(logits, y) averaged over the N rows. sigma is *sp ('free')
 * or softplus(*sp) ('positive', threshold 20 as torch's); *g_sp gets dCE / d*sp.
 * The normalisations' backward by algebra: with gc = dCE/dcos, c_k = sum_n gc cos, r_n = sum_k gc cos,
 *   dCE/dW = A^T f - diag(c / |w|^2) W,   dCE/df = A W - diag(r / |f|^2) f,   A = gc / (|f| |w|^T),
 * (c_k = 0 for a row of norm < eps, r_n likewise: F.normalize's clamp passes no gradient to the norm there).
 * Overwrites M with A and writes Wc = -c/|w|^2 W, fr = -r/|f|^2 f, so that two addmm finish the products.
 * Returns the CE. Scratch: E, G [N, K]; dfv, cen, gsn [N]; dwv, live [K]. */
static void head_norms(const float *restrict W, float *restrict dwv, float *restrict live, int64_t d,
                       int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; k++) {
        float nw = sqrtf(rowdot(W + k * d, W + k * d, d));
        dwv[k] = nw < 1e-12f ? 1e-12f : nw;
        live[k] = nw < 1e-12f ? 0.0f : 1.0f;
    }
}
static void head_rows(float *restrict M, const float *restrict f, const float *restrict nf2,
                      const int64_t *restrict y, const float *restrict dwv, float sigma, float invN, int64_t K,
                      int64_t d, float *restrict fr, float *restrict E, float *restrict G, float *restrict dfv,
                      float *restrict cen, float *restrict gsn, int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; n++) {
        float nf = sqrtf(nf2[n]);
        float df = nf < 1e-12f ? 1e-12f : nf;
        dfv[n] = df;
        float *restrict m = M + n * K, *restrict e = E + n * K, *restrict gg = G + n * K;
        int64_t yn = y[n];
        for (int64_t k = 0; k < K; k++) m[k] = m[k] / df / dwv[k];
        float mx = sigma * m[0];
        for (int64_t k = 1; k < K; k++) { float l = sigma * m[k]; mx = l > mx ? l : mx; }
        for (int64_t k = 0; k < K; k++) e[k] = vexp(sigma * m[k] - mx);
        float se = rowsum(e, K);
        cen[n] = (mx + logf(se)) - sigma * m[yn];
        float inv = 1.0f / se;
        for (int64_t k = 0; k < K; k++) {
            float cs = m[k];
            float gl = (e[k] * inv - (k == yn ? 1.0f : 0.0f)) * invN; /* dCE/dlogit */
            float gc = gl * sigma;                                     /* dCE/dcos */
            e[k] = gl * cs;
            gg[k] = gc * cs;
            m[k] = gc / df / dwv[k]; /* A */
        }
        gsn[n] = rowsum(e, K);
        float r = nf < 1e-12f ? 0.0f : rowsum(gg, K);
        float cr = -r / df / df;
        const float *restrict fn = f + n * d;
        float *restrict frn = fr + n * d;
        for (int64_t c = 0; c < d; c++) frn[c] = cr * fn[c];
    }
}
static void head_cols(const float *restrict W, const float *restrict G, const float *restrict dwv,
                      const float *restrict live, float *restrict Wc, int64_t N, int64_t K, int64_t d,
                      int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; k++) {
        float ck = 0.0f;
        for (int64_t n = 0; n < N; n++) ck += G[n * K + k];
        ck = live[k] == 0.0f ? 0.0f : -ck / dwv[k] / dwv[k];
        const float *restrict wk = W + k * d;
        float *restrict wck = Wc + k * d;
        for (int64_t c = 0; c < d; c++) wck[c] = ck * wk[c];
    }
}
float head(float *M, const float *f, const float *nf2, const float *W, const int64_t *y, int64_t N, int64_t K,
           int64_t d, const float *sp, int free_sigma, float *g_sp, float *Wc, float *fr, float *E, float *G,
           float *dfv, float *cen, float *gsn, float *dwv, float *live, int T) {
    float x = *sp, sigma = free_sigma || x > 20.0f ? x : log1pf(expf(x));
    float invN = 1.0f / (float)N;
    PER_CHUNK(T, K, lo, hi, head_norms(W, dwv, live, d, lo, hi))
    PER_CHUNK(T, N, lo, hi, head_rows(M, f, nf2, y, dwv, sigma, invN, K, d, fr, E, G, dfv, cen, gsn, lo, hi))
    PER_CHUNK(T, K, lo, hi, head_cols(W, G, dwv, live, Wc, N, K, d, lo, hi))
    float ce = 0.0f, gs = 0.0f;
    for (int64_t n = 0; n < N; n++) { ce += cen[n]; gs += gsn[n]; }
    if (free_sigma || x > 20.0f) *g_sp = gs;
    else { float z = expf(x); *g_sp = gs * z / (z + 1.0f); } /* torch's softplus_backward */
    return ce * invN;
}

/* ---- the update: g += l1 sign(p) on the first n_l1 elements; m = m mom + g; p += -lr m ---------------------
 * The same roundings as lab/tosca/_step.py's flat_update (torch's add_ with alpha is one fma), so the two give
 * the same bits. g is left as it was. */
static void update_span(float *restrict p, const float *restrict g, float *restrict m, int64_t n_l1, float nlr,
                        float l1, float mom, int64_t lo, int64_t hi) {
    int64_t mid = hi < n_l1 ? hi : (lo > n_l1 ? lo : n_l1);
    for (int64_t i = lo; i < mid; i++) {
        float pi = p[i];
        float s = (float)(pi > 0.0f) - (float)(pi < 0.0f);
        float mi = m[i] * mom;
        mi = mi + fmaf(s, l1, g[i]);
        m[i] = mi;
        p[i] = fmaf(mi, nlr, pi);
    }
    for (int64_t i = mid; i < hi; i++) {
        float mi = m[i] * mom;
        mi = mi + g[i];
        m[i] = mi;
        p[i] = fmaf(mi, nlr, p[i]);
    }
}
void flat_update(float *p, const float *g, float *m, int64_t n, int64_t n_l1, float lr, float l1, float mom, int T) {
    PER_CHUNK(T, n, lo, hi, update_span(p, g, m, n_l1, -lr, l1, mom, lo, hi))
}
