/* The router's block hash in C: XXH3-64 (seeded), chained over blocks of u32 token ids.
 *
 * The definition is switchyard.common.block_hash's docstring; block_hash.py keeps the pure
 * Python form (the fallback, and the reference the tests compare this with).
 *
 *   xxh3_64(data, seed=0)                       one XXH3-64 hash of a bytes-like object
 *   chain_hashes(data, step, start, n, parent)  the chain over packed u32 token bytes
 *   block_hashes(token_ids, block_size, parent) the chain over a sequence of ints
 *   token_count(raw)                            the length of a msgpack array (its header)
 *   check_token_cells(raw)                      that every cell is an int or [int, any]
 *   msgpack_block_hashes(raw, block_size, parent)  the chain over a msgpack token array
 *
 * XXH3-64 is written here from the xxHash specification (doc/xxhash_spec.md, "XXH3"): scalar
 * code, every read little-endian byte by byte (compilers fold them into one load), so it
 * gives the same hashes on any host.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define SEED 1337
#define SECRET_SIZE 192
#define STRIPE_LEN 64
#define SECRET_CONSUME_RATE 8
#define ACC_NB 8
#define MIDSIZE_MAX 240
#define MIDSIZE_START_OFFSET 3
#define MIDSIZE_LAST_OFFSET 17
#define SECRET_SIZE_MIN 136
#define SECRET_LASTACC_START 7
#define SECRET_MERGEACCS_START 11

static const uint32_t PRIME32_1 = 0x9E3779B1U;
static const uint32_t PRIME32_2 = 0x85EBCA77U;
static const uint32_t PRIME32_3 = 0xC2B2AE3DU;
static const uint64_t PRIME64_1 = 0x9E3779B185EBCA87ULL;
static const uint64_t PRIME64_2 = 0xC2B2AE3D27D4EB4FULL;
static const uint64_t PRIME64_3 = 0x165667B19E3779F9ULL;
static const uint64_t PRIME64_4 = 0x85EBCA77C2B2AE63ULL;
static const uint64_t PRIME64_5 = 0x27D4EB2F165667C5ULL;
static const uint64_t PRIME_MX1 = 0x165667919E3779F9ULL;
static const uint64_t PRIME_MX2 = 0x9FB21C651E98DF25ULL;

/* The specification's default secret (kSecret). */
static const uint8_t DEFAULT_SECRET[SECRET_SIZE] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

/* The secret of seed SEED for inputs above MIDSIZE_MAX (derived once, at import). */
static uint8_t seed_secret[SECRET_SIZE];

/* ---- portable little-endian access ----------------------------------------------------- */

static inline uint32_t read32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static inline uint64_t read64(const uint8_t *p)
{
    return (uint64_t)read32(p) | ((uint64_t)read32(p + 4) << 32);
}

static inline void write32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline void write64(uint8_t *p, uint64_t v)
{
    write32(p, (uint32_t)v);
    write32(p + 4, (uint32_t)(v >> 32));
}

/* ---- XXH3-64 --------------------------------------------------------------------------- */

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint32_t swap32(uint32_t x)
{
    return (x >> 24) | ((x >> 8) & 0xff00U) | ((x << 8) & 0xff0000U) | (x << 24);
}

static inline uint64_t swap64(uint64_t x)
{
    return ((uint64_t)swap32((uint32_t)x) << 32) | swap32((uint32_t)(x >> 32));
}

/* The 128-bit product of a and b, its two halves xored. */
static inline uint64_t mul128_fold64(uint64_t a, uint64_t b)
{
#if defined(__SIZEOF_INT128__) && !defined(BLOCKHASH_PORTABLE_MUL)
    unsigned __int128 product = (unsigned __int128)a * b;
    return (uint64_t)product ^ (uint64_t)(product >> 64);
#else
    uint64_t lo_lo = (a & 0xFFFFFFFFULL) * (b & 0xFFFFFFFFULL);
    uint64_t hi_lo = (a >> 32) * (b & 0xFFFFFFFFULL);
    uint64_t lo_hi = (a & 0xFFFFFFFFULL) * (b >> 32);
    uint64_t hi_hi = (a >> 32) * (b >> 32);
    uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFULL) + lo_hi;
    uint64_t upper = (hi_lo >> 32) + (cross >> 32) + hi_hi;
    uint64_t lower = (cross << 32) | (lo_lo & 0xFFFFFFFFULL);
    return lower ^ upper;
#endif
}

static inline uint64_t xxh64_avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= PRIME64_2;
    h ^= h >> 29;
    h *= PRIME64_3;
    h ^= h >> 32;
    return h;
}

static inline uint64_t xxh3_avalanche(uint64_t h)
{
    h ^= h >> 37;
    h *= PRIME_MX1;
    h ^= h >> 32;
    return h;
}

static inline uint64_t rrmxmx(uint64_t h, uint64_t len)
{
    h ^= rotl64(h, 49) ^ rotl64(h, 24);
    h *= PRIME_MX2;
    h ^= (h >> 35) + len;
    h *= PRIME_MX2;
    return h ^ (h >> 28);
}

static inline uint64_t mix16(const uint8_t *in, const uint8_t *secret, uint64_t seed)
{
    uint64_t lo = read64(in) ^ (read64(secret) + seed);
    uint64_t hi = read64(in + 8) ^ (read64(secret + 8) - seed);
    return mul128_fold64(lo, hi);
}

static uint64_t hash_0to16(const uint8_t *in, size_t len, const uint8_t *secret, uint64_t seed)
{
    if (len > 8) {
        uint64_t flip_lo = (read64(secret + 24) ^ read64(secret + 32)) + seed;
        uint64_t flip_hi = (read64(secret + 40) ^ read64(secret + 48)) - seed;
        uint64_t lo = read64(in) ^ flip_lo;
        uint64_t hi = read64(in + len - 8) ^ flip_hi;
        uint64_t acc = len + swap64(lo) + hi + mul128_fold64(lo, hi);
        return xxh3_avalanche(acc);
    }
    if (len >= 4) {
        uint64_t s = seed ^ ((uint64_t)swap32((uint32_t)seed) << 32);
        uint32_t first = read32(in);
        uint32_t last = read32(in + len - 4);
        uint64_t flip = (read64(secret + 8) ^ read64(secret + 16)) - s;
        uint64_t combined = (uint64_t)last + ((uint64_t)first << 32);
        return rrmxmx(combined ^ flip, len);
    }
    if (len > 0) {
        uint32_t combined = ((uint32_t)in[0] << 16) | ((uint32_t)in[len >> 1] << 24) |
                            (uint32_t)in[len - 1] | ((uint32_t)len << 8);
        uint64_t flip = (uint64_t)(read32(secret) ^ read32(secret + 4)) + seed;
        return xxh64_avalanche((uint64_t)combined ^ flip);
    }
    return xxh64_avalanche(seed ^ read64(secret + 56) ^ read64(secret + 64));
}

static uint64_t hash_17to128(const uint8_t *in, size_t len, const uint8_t *secret, uint64_t seed)
{
    uint64_t acc = len * PRIME64_1;
    if (len > 32) {
        if (len > 64) {
            if (len > 96) {
                acc += mix16(in + 48, secret + 96, seed);
                acc += mix16(in + len - 64, secret + 112, seed);
            }
            acc += mix16(in + 32, secret + 64, seed);
            acc += mix16(in + len - 48, secret + 80, seed);
        }
        acc += mix16(in + 16, secret + 32, seed);
        acc += mix16(in + len - 32, secret + 48, seed);
    }
    acc += mix16(in, secret, seed);
    acc += mix16(in + len - 16, secret + 16, seed);
    return xxh3_avalanche(acc);
}

static uint64_t hash_129to240(const uint8_t *in, size_t len, const uint8_t *secret,
                              uint64_t seed)
{
    uint64_t acc = len * PRIME64_1;
    size_t rounds = len / 16;
    size_t i;
    for (i = 0; i < 8; i++)
        acc += mix16(in + 16 * i, secret + 16 * i, seed);
    acc = xxh3_avalanche(acc);
    for (i = 8; i < rounds; i++)
        acc += mix16(in + 16 * i, secret + 16 * (i - 8) + MIDSIZE_START_OFFSET, seed);
    acc += mix16(in + len - 16, secret + SECRET_SIZE_MIN - MIDSIZE_LAST_OFFSET, seed);
    return xxh3_avalanche(acc);
}

static inline void accumulate_stripe(uint64_t *acc, const uint8_t *in, const uint8_t *secret)
{
    for (int i = 0; i < ACC_NB; i++) {
        uint64_t value = read64(in + 8 * i);
        uint64_t key = value ^ read64(secret + 8 * i);
        acc[i ^ 1] += value;
        acc[i] += (uint64_t)(uint32_t)key * (key >> 32);
    }
}

static inline void scramble(uint64_t *acc, const uint8_t *secret)
{
    for (int i = 0; i < ACC_NB; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= read64(secret + 8 * i);
        a *= PRIME32_1;
        acc[i] = a;
    }
}

/* Inputs above MIDSIZE_MAX: `secret` is already derived from the seed. */
static uint64_t hash_long(const uint8_t *in, size_t len, const uint8_t *secret)
{
    uint64_t acc[ACC_NB] = {PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3,
                            PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1};
    const size_t stripes_per_block = (SECRET_SIZE - STRIPE_LEN) / SECRET_CONSUME_RATE;
    const size_t block_len = STRIPE_LEN * stripes_per_block;
    const size_t blocks = (len - 1) / block_len;
    size_t b, s;
    for (b = 0; b < blocks; b++) {
        for (s = 0; s < stripes_per_block; s++)
            accumulate_stripe(acc, in + b * block_len + s * STRIPE_LEN,
                              secret + s * SECRET_CONSUME_RATE);
        scramble(acc, secret + SECRET_SIZE - STRIPE_LEN);
    }
    const size_t last_stripes = ((len - 1) - block_len * blocks) / STRIPE_LEN;
    for (s = 0; s < last_stripes; s++)
        accumulate_stripe(acc, in + blocks * block_len + s * STRIPE_LEN,
                          secret + s * SECRET_CONSUME_RATE);
    accumulate_stripe(acc, in + len - STRIPE_LEN,
                      secret + SECRET_SIZE - STRIPE_LEN - SECRET_LASTACC_START);
    uint64_t result = len * PRIME64_1;
    for (int i = 0; i < 4; i++) {
        const uint8_t *key = secret + SECRET_MERGEACCS_START + 16 * i;
        result += mul128_fold64(acc[2 * i] ^ read64(key), acc[2 * i + 1] ^ read64(key + 8));
    }
    return xxh3_avalanche(result);
}

static void derive_secret(uint8_t *out, uint64_t seed)
{
    for (int i = 0; i < SECRET_SIZE / 16; i++) {
        write64(out + 16 * i, read64(DEFAULT_SECRET + 16 * i) + seed);
        write64(out + 16 * i + 8, read64(DEFAULT_SECRET + 16 * i + 8) - seed);
    }
}

/* XXH3-64 of in[0:len] with `seed`; `long_secret` is the secret derived from that seed (used
 * only above MIDSIZE_MAX bytes; NULL: derive it here). */
static uint64_t xxh3(const uint8_t *in, size_t len, uint64_t seed, const uint8_t *long_secret)
{
    if (len <= 16)
        return hash_0to16(in, len, DEFAULT_SECRET, seed);
    if (len <= 128)
        return hash_17to128(in, len, DEFAULT_SECRET, seed);
    if (len <= MIDSIZE_MAX)
        return hash_129to240(in, len, DEFAULT_SECRET, seed);
    if (long_secret == NULL) {
        uint8_t derived[SECRET_SIZE];
        derive_secret(derived, seed);
        return hash_long(in, len, derived);
    }
    return hash_long(in, len, long_secret);
}

static inline uint64_t block_hash(const uint8_t *in, size_t len)
{
    return xxh3(in, len, SEED, seed_secret);
}

/* ---- the chain ------------------------------------------------------------------------- */

/* A block's hashed bytes: the parent's hash (8 bytes, absent for a root) then its tokens.
 * Blocks of up to STACK_TOKENS tokens live on the stack. */
#define STACK_TOKENS 256

typedef struct {
    uint8_t stack[8 + 4 * STACK_TOKENS];
    uint8_t *buf;
} BlockBuf;

static int blockbuf_init(BlockBuf *b, Py_ssize_t block_size)
{
    if (block_size <= STACK_TOKENS) {
        b->buf = b->stack;
        return 0;
    }
    if ((size_t)block_size > (PY_SSIZE_T_MAX - 8) / 4) {
        PyErr_NoMemory();
        return -1;
    }
    b->buf = PyMem_Malloc(8 + 4 * (size_t)block_size);
    if (b->buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void blockbuf_free(BlockBuf *b)
{
    if (b->buf != b->stack)
        PyMem_Free(b->buf);
}

/* Appends the hash to `out` (a list of `n` slots) at `i`; the next block's prefix is written
 * into `buf`. */
static inline int put_hash(PyObject *out, Py_ssize_t i, uint64_t h, uint8_t *buf)
{
    PyObject *value = PyLong_FromUnsignedLongLong(h);
    if (value == NULL)
        return -1;
    PyList_SET_ITEM(out, i, value);
    write64(buf, h);
    return 0;
}

/* `parent` (None or a u64 int) -> *has_parent, *value. */
static int parse_parent(PyObject *parent, int *has_parent, uint64_t *value)
{
    if (parent == Py_None) {
        *has_parent = 0;
        return 0;
    }
    if (!PyLong_Check(parent)) {
        PyErr_SetString(PyExc_TypeError, "parent must be an int or None");
        return -1;
    }
    *value = PyLong_AsUnsignedLongLong(parent);
    if (*value == (uint64_t)-1 && PyErr_Occurred())
        return -1;
    *has_parent = 1;
    return 0;
}

/* A chain of `n` blocks of `block_size` tokens being hashed one by one: the caller writes a
 * block's tokens at `block.buf + 8` (u32 little-endian), then chain_push hashes it. */
typedef struct {
    BlockBuf block;
    int has_parent;
    PyObject *out; /* the hashes: a list of n slots */
} Chain;

/* 0, or -1 with an exception (then chain_close still has to be called). */
static int chain_open(Chain *c, PyObject *parent, Py_ssize_t n, Py_ssize_t block_size)
{
    uint64_t h = 0;
    c->block.buf = NULL;
    c->has_parent = 0;
    c->out = NULL;
    if (n > 0 && parse_parent(parent, &c->has_parent, &h) < 0)
        return -1;
    if (blockbuf_init(&c->block, block_size) < 0)
        return -1;
    c->out = PyList_New(n);
    if (c->out == NULL)
        return -1;
    write64(c->block.buf, h);
    return 0;
}

/* Hashes block `i` (its tokens written), chained to the one before. */
static inline int chain_push(Chain *c, Py_ssize_t i, Py_ssize_t block_size)
{
    uint8_t *buf = c->block.buf;
    uint64_t h = c->has_parent ? block_hash(buf, 8 + 4 * (size_t)block_size)
                               : block_hash(buf + 8, 4 * (size_t)block_size);
    c->has_parent = 1;
    return put_hash(c->out, i, h, buf);
}

/* The hash list, or NULL (with the exception set) when `failed`. */
static PyObject *chain_close(Chain *c, int failed)
{
    if (c->block.buf != NULL)
        blockbuf_free(&c->block);
    if (failed)
        Py_CLEAR(c->out);
    return c->out;
}

static PyObject *py_xxh3_64(PyObject *self, PyObject *args)
{
    Py_buffer data;
    unsigned long long seed = 0;
    if (!PyArg_ParseTuple(args, "y*|K:xxh3_64", &data, &seed))
        return NULL;
    uint64_t h = xxh3(data.buf, (size_t)data.len, seed, NULL);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(h);
}

/* chain_hashes(data, step, start, n, parent): as block_hash.chain_hashes. */
static PyObject *py_chain_hashes(PyObject *self, PyObject *args)
{
    Py_buffer data;
    Py_ssize_t step, start, n;
    PyObject *parent;
    if (!PyArg_ParseTuple(args, "y*nnnO:chain_hashes", &data, &step, &start, &n, &parent))
        return NULL;
    PyObject *out = NULL;
    BlockBuf block = {.buf = NULL};
    int has_parent = 0;
    uint64_t h = 0;
    if (step < 1 || start < 0 || n < start || n > data.len / step) {
        PyErr_SetString(PyExc_ValueError, "blocks outside the data");
        goto done;
    }
    if (n > start && parse_parent(parent, &has_parent, &h) < 0)
        goto done;
    if (blockbuf_init(&block, step / 4 + 1) < 0)
        goto done;
    out = PyList_New(n - start);
    if (out == NULL)
        goto done;
    const uint8_t *chunk = (const uint8_t *)data.buf + start * step;
    write64(block.buf, h);
    for (Py_ssize_t i = 0; i < n - start; i++, chunk += step) {
        if (has_parent) {
            memcpy(block.buf + 8, chunk, (size_t)step);
            h = block_hash(block.buf, 8 + (size_t)step);
        }
        else {
            h = block_hash(chunk, (size_t)step);
            has_parent = 1;
        }
        if (put_hash(out, i, h, block.buf) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    if (block.buf != NULL)
        blockbuf_free(&block);
    PyBuffer_Release(&data);
    return out;
}

/* A token id as a u32, as array("I") packs it: ints (and __index__ objects) in 0..2^32-1;
 * ValueError out of range, TypeError for anything else. */
static int token_u32_slow(PyObject *item, uint32_t *out)
{
    unsigned long value;
    if (PyLong_Check(item)) {
        value = PyLong_AsUnsignedLong(item);
    }
    else {
        PyObject *index = PyNumber_Index(item);
        if (index == NULL)
            return -1;
        value = PyLong_AsUnsignedLong(index);
        Py_DECREF(index);
    }
    if (value == (unsigned long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        goto range;
    }
    if (value > 0xFFFFFFFFUL)
        goto range;
    *out = (uint32_t)value;
    return 0;
range:
    PyErr_SetString(PyExc_ValueError, "token ids must fit in an unsigned 32-bit int");
    return -1;
}

/* token_u32_slow, reading a small exact int's digits directly (token ids are small ints:
 * PyLong_AsUnsignedLong's checks cost more than the packing itself). */
static inline int token_u32(PyObject *item, uint32_t *out)
{
    if (PyLong_CheckExact(item)) {
#if PY_VERSION_HEX >= 0x030C0000
        if (PyUnstable_Long_IsCompact((PyLongObject *)item)) {
            Py_ssize_t value = PyUnstable_Long_CompactValue((PyLongObject *)item);
            if (value >= 0 && (uint64_t)value <= 0xFFFFFFFFULL) {
                *out = (uint32_t)value;
                return 0;
            }
        }
#else
        /* CPython 3.11: the sign is the sign of ob_size, its magnitude the digit count. */
        Py_ssize_t size = Py_SIZE(item);
        const digit *digits = ((PyLongObject *)item)->ob_digit;
        if (size == 0 || size == 1) {
            *out = size ? (uint32_t)digits[0] : 0;
            return 0;
        }
        if (size == 2) {
            uint64_t value = (uint64_t)digits[0] | ((uint64_t)digits[1] << PyLong_SHIFT);
            if (value <= 0xFFFFFFFFULL) {
                *out = (uint32_t)value;
                return 0;
            }
        }
#endif
    }
    return token_u32_slow(item, out);
}

/* block_hashes(token_ids, block_size, parent=None): as block_hash.block_hashes, packing each
 * block's tokens into the hashed bytes and hashing them in one pass. */
static PyObject *py_block_hashes(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"token_ids", "block_size", "parent", NULL};
    PyObject *tokens;
    Py_ssize_t block_size;
    PyObject *parent = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On|O:block_hashes", names, &tokens,
                                     &block_size, &parent))
        return NULL;
    if (block_size < 1)
        return PyErr_Format(PyExc_ValueError, "block_size must be >= 1, got %zd", block_size);
    PyObject *seq = PySequence_Fast(tokens, "token_ids must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq) / block_size;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Chain chain;
    int failed = chain_open(&chain, parent, n, block_size) < 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        uint8_t *dst = chain.block.buf + 8;
        PyObject **cells = items + i * block_size;
        for (Py_ssize_t t = 0; t < block_size && !failed; t++) {
            uint32_t token;
            failed = token_u32(cells[t], &token) < 0;
            if (!failed)
                write32(dst + 4 * t, token);
        }
        failed = failed || chain_push(&chain, i, block_size) < 0;
    }
    PyObject *out = chain_close(&chain, failed);
    Py_DECREF(seq);
    return out;
}

/* ---- msgpack token arrays -------------------------------------------------------------- */

/* A reader over one msgpack value: BlockStored's token_ids as msgspec.Raw kept it. */
typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} Reader;

enum { CELL_OK = 0, CELL_SHAPE = -1, CELL_RANGE = -2, CELL_TRUNCATED = -3 };

static inline uint64_t read_be(const uint8_t *p, int width)
{
    uint64_t v = 0;
    for (int i = 0; i < width; i++)
        v = (v << 8) | p[i];
    return v;
}

/* An array header: its length, or CELL_SHAPE when the value is not an array. */
static int64_t read_array_header(Reader *r)
{
    if (r->p >= r->end)
        return CELL_TRUNCATED;
    uint8_t b = *r->p;
    if ((b & 0xf0) == 0x90) {
        r->p++;
        return b & 0x0f;
    }
    int width = b == 0xdc ? 2 : b == 0xdd ? 4 : 0;
    if (width == 0)
        return CELL_SHAPE;
    if (r->end - r->p < 1 + width)
        return CELL_TRUNCATED;
    uint64_t n = read_be(r->p + 1, width);
    r->p += 1 + width;
    return (int64_t)n;
}

/* One msgpack int (any width, either sign). CELL_SHAPE when the value is not an int (the
 * reader has not moved then). *negative is set for a value below zero. */
static int read_int(Reader *r, uint64_t *value, int *negative)
{
    if (r->p >= r->end)
        return CELL_TRUNCATED;
    uint8_t b = *r->p;
    *negative = 0;
    if (b <= 0x7f) {
        *value = b;
        r->p++;
        return CELL_OK;
    }
    if (b >= 0xe0) {
        *negative = 1;
        r->p++;
        return CELL_OK;
    }
    int width, is_signed;
    switch (b) {
    case 0xcc: width = 1; is_signed = 0; break;
    case 0xcd: width = 2; is_signed = 0; break;
    case 0xce: width = 4; is_signed = 0; break;
    case 0xcf: width = 8; is_signed = 0; break;
    case 0xd0: width = 1; is_signed = 1; break;
    case 0xd1: width = 2; is_signed = 1; break;
    case 0xd2: width = 4; is_signed = 1; break;
    case 0xd3: width = 8; is_signed = 1; break;
    default: return CELL_SHAPE;
    }
    if (r->end - r->p < 1 + width)
        return CELL_TRUNCATED;
    uint64_t v = read_be(r->p + 1, width);
    r->p += 1 + width;
    if (is_signed && (v >> (8 * width - 1)) & 1)
        *negative = 1;
    *value = v;
    return CELL_OK;
}

/* Skips one msgpack value of any type (the second item of a bigram cell). */
static int skip_value(Reader *r, int depth)
{
    if (depth > 64)
        return CELL_SHAPE;
    if (r->p >= r->end)
        return CELL_TRUNCATED;
    uint8_t b = *r->p++;
    uint64_t items = 0; /* nested values that follow */
    size_t skip = 0;    /* bytes that follow */
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return CELL_OK;
    if ((b & 0xe0) == 0xa0)
        skip = b & 0x1f;
    else if ((b & 0xf0) == 0x90)
        items = b & 0x0f;
    else if ((b & 0xf0) == 0x80)
        items = 2 * (uint64_t)(b & 0x0f);
    else {
        int width;
        switch (b) {
        case 0xcc: case 0xd0: skip = 1; break;
        case 0xcd: case 0xd1: skip = 2; break;
        case 0xce: case 0xd2: case 0xca: skip = 4; break;
        case 0xcf: case 0xd3: case 0xcb: skip = 8; break;
        case 0xd4: skip = 2; break; /* fixext: type byte + data */
        case 0xd5: skip = 3; break;
        case 0xd6: skip = 5; break;
        case 0xd7: skip = 9; break;
        case 0xd8: skip = 17; break;
        case 0xc4: case 0xd9: width = 1; goto sized;
        case 0xc5: case 0xda: width = 2; goto sized;
        case 0xc6: case 0xdb: width = 4; goto sized;
        case 0xc7: width = 1; goto sized_ext;
        case 0xc8: width = 2; goto sized_ext;
        case 0xc9: width = 4; goto sized_ext;
        case 0xdc: width = 2; goto counted;
        case 0xdd: width = 4; goto counted;
        case 0xde: width = 2; goto counted_map;
        case 0xdf: width = 4; goto counted_map;
        default: return CELL_SHAPE; /* 0xc1: never used */
        }
        goto bytes;
    sized:
        if (r->end - r->p < width)
            return CELL_TRUNCATED;
        skip = (size_t)read_be(r->p, width);
        r->p += width;
        goto bytes;
    sized_ext:
        if (r->end - r->p < width)
            return CELL_TRUNCATED;
        skip = (size_t)read_be(r->p, width) + 1;
        r->p += width;
        goto bytes;
    counted:
        if (r->end - r->p < width)
            return CELL_TRUNCATED;
        items = read_be(r->p, width);
        r->p += width;
        goto nested;
    counted_map:
        if (r->end - r->p < width)
            return CELL_TRUNCATED;
        items = 2 * read_be(r->p, width);
        r->p += width;
        goto nested;
    }
bytes:
    if ((size_t)(r->end - r->p) < skip)
        return CELL_TRUNCATED;
    r->p += skip;
nested:
    for (uint64_t i = 0; i < items; i++) {
        int status = skip_value(r, depth + 1);
        if (status != CELL_OK)
            return status;
    }
    return CELL_OK;
}

/* One token cell: an int, or a 2-item array [token, next_token] whose first item is an int
 * (Eagle's bigram cells: the token counts), as decode.py's `_token` reads it. CELL_SHAPE for
 * any other cell; CELL_RANGE for an int outside u32 (the index's malformed event). */
static int read_cell_slow(Reader *r, uint32_t *token)
{
    uint64_t value = 0;
    int negative;
    int status = read_int(r, &value, &negative);
    if (status == CELL_SHAPE) {
        int64_t items = read_array_header(r);
        if (items < 0)
            return (int)items;
        if (items != 2)
            return CELL_SHAPE;
        status = read_int(r, &value, &negative);
        if (status != CELL_OK)
            return status;
        status = skip_value(r, 0);
    }
    if (status != CELL_OK)
        return status;
    if (negative || value > 0xFFFFFFFFULL)
        return CELL_RANGE;
    *token = (uint32_t)value;
    return CELL_OK;
}

/* read_cell_slow, with the cells encoders write for token ids (a positive fixint, or uint8
 * to uint64) read without a branch on their width: token ids of a vocabulary mix uint16 and
 * uint32 cells at random, and a mispredicted branch per token was most of the parse. */
static inline int read_cell(Reader *r, uint32_t *token)
{
    const uint8_t *p = r->p;
    if (r->end - p >= 9) {
        uint8_t b = p[0];
        if (b <= 0x7f) {
            *token = b;
            r->p = p + 1;
            return CELL_OK;
        }
        if ((b & 0xfc) == 0xcc) { /* 0xcc..0xcf: uint of 1 << (b & 3) bytes */
            int width_log2 = b & 3;
            uint64_t value = read_be(p + 1, 8) >> (64 - (8 << width_log2));
            r->p = p + 1 + (1 << width_log2);
            if (value > 0xFFFFFFFFULL)
                return CELL_RANGE;
            *token = (uint32_t)value;
            return CELL_OK;
        }
    }
    return read_cell_slow(r, token);
}

static int cell_error(int status)
{
    if (status == CELL_RANGE)
        PyErr_SetString(PyExc_ValueError, "token ids must fit in an unsigned 32-bit int");
    else if (status == CELL_TRUNCATED)
        PyErr_SetString(PyExc_ValueError, "truncated msgpack token array");
    else
        PyErr_SetString(PyExc_TypeError, "token id is not an int");
    return -1;
}

/* The array header of a Raw: its length. TypeError when the value is not an array. */
static int64_t raw_header(Reader *r, PyObject *raw, Py_buffer *view)
{
    if (PyObject_GetBuffer(raw, view, PyBUF_SIMPLE) < 0)
        return -1;
    r->p = view->buf;
    r->end = r->p + view->len;
    int64_t n = read_array_header(r);
    if (n < 0) {
        PyBuffer_Release(view);
        if (n == CELL_SHAPE)
            PyErr_SetString(PyExc_TypeError, "token_ids is not an array");
        else
            cell_error((int)n);
        return -1;
    }
    return n;
}

static PyObject *py_token_count(PyObject *self, PyObject *raw)
{
    Reader r;
    Py_buffer view;
    int64_t n = raw_header(&r, raw, &view);
    if (n < 0)
        return NULL;
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(n);
}

/* check_token_cells(raw) -> count: TypeError unless every cell is an int or a bigram cell
 * (ints outside u32 pass: they are the index's malformed events, not the decoder's). */
static PyObject *py_check_token_cells(PyObject *self, PyObject *raw)
{
    Reader r;
    Py_buffer view;
    int64_t n = raw_header(&r, raw, &view);
    if (n < 0)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        uint32_t token;
        int status = read_cell(&r, &token);
        if (status != CELL_OK && status != CELL_RANGE) {
            PyBuffer_Release(&view);
            cell_error(status);
            return NULL;
        }
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(n);
}

/* msgpack_block_hashes(raw, block_size, parent) -> the chained hashes of the full blocks of
 * a msgpack token array, as block_hashes of its tokens. ValueError for a block_size below 1
 * or a token outside u32, TypeError for a cell that is not a token. */
static PyObject *py_msgpack_block_hashes(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"raw", "block_size", "parent", NULL};
    PyObject *raw;
    Py_ssize_t block_size;
    PyObject *parent = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On|O:msgpack_block_hashes", names, &raw,
                                     &block_size, &parent))
        return NULL;
    if (block_size < 1)
        return PyErr_Format(PyExc_ValueError, "block_size must be >= 1, got %zd", block_size);
    Reader r;
    Py_buffer view;
    int64_t count = raw_header(&r, raw, &view);
    if (count < 0)
        return NULL;
    Py_ssize_t n = (Py_ssize_t)(count / block_size);
    Chain chain;
    int failed = chain_open(&chain, parent, n, block_size) < 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        uint8_t *dst = chain.block.buf + 8;
        for (Py_ssize_t t = 0; t < block_size && !failed; t++) {
            uint32_t token;
            int status = read_cell(&r, &token);
            failed = status != CELL_OK;
            if (failed)
                cell_error(status);
            else
                write32(dst + 4 * t, token);
        }
        failed = failed || chain_push(&chain, i, block_size) < 0;
    }
    PyObject *out = chain_close(&chain, failed);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"xxh3_64", py_xxh3_64, METH_VARARGS, "xxh3_64(data, seed=0) -> int: XXH3-64 of data."},
    {"chain_hashes", py_chain_hashes, METH_VARARGS,
     "chain_hashes(data, step, start, n, parent) -> list[int]: as block_hash.chain_hashes."},
    {"block_hashes", (PyCFunction)(void (*)(void))py_block_hashes,
     METH_VARARGS | METH_KEYWORDS,
     "block_hashes(token_ids, block_size, parent=None) -> list[int]: as "
     "block_hash.block_hashes."},
    {"token_count", py_token_count, METH_O,
     "token_count(raw) -> int: the length of a msgpack array."},
    {"check_token_cells", py_check_token_cells, METH_O,
     "check_token_cells(raw) -> int: the length of a msgpack array of token cells; "
     "TypeError for a cell that is neither an int nor [int, any]."},
    {"msgpack_block_hashes", (PyCFunction)(void (*)(void))py_msgpack_block_hashes,
     METH_VARARGS | METH_KEYWORDS,
     "msgpack_block_hashes(raw, block_size, parent=None) -> list[int]: block_hashes of the "
     "tokens of a msgpack token array."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_blockhash",
    "The router's block hash (XXH3-64, seed 1337, chained) in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__blockhash(void)
{
    derive_secret(seed_secret, SEED);
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "SEED", SEED) < 0)
        Py_CLEAR(m);
    return m;
}
