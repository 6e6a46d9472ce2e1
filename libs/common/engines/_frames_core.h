/* HTTP/2 frames of an engine connection and the relay of plain token chunks: the C core.
 *
 * No Python API here (the extension's glue is _frames.c; the fuzz harness links this alone).
 * What it does is frames.py's docstring, and frames.py is the same algorithm in Python: the
 * two must give identical events and identical batch bytes for any input (the parity tests).
 *
 *   fr_reader_feed(r, data, n)     append bytes read from the connection
 *   fr_next(r, &ev)                the next event: 1 one, 0 none until more bytes, -1 no memory
 *   fr_relay(r, id, ...)           relay a stream's plain chunks into a batch (fr_buf)
 *   fr_take(r, id)                 stop relaying a stream (the caller frees what it returns)
 *
 * Every read of the input is bounds-checked against what was fed; nothing trusts a length.
 */
#ifndef SWITCHYARD_FRAMES_CORE_H
#define SWITCHYARD_FRAMES_CORE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FR_DATA 0
#define FR_HEADERS 1
#define FR_END_STREAM 0x1
#define FR_PADDED 0x8
#define FR_HANDBACK 0x100
#define FR_REFILL 0x101
#define FR_SGLANG 2 /* GenerateResponse: request_id = 1, chunk = 2, complete = 3 */
#define FR_VLLM 1   /* GenerateResponse: chunk = 1, complete = 2 */

/* A growable byte buffer; `count` is the number of replies in a batch. */
typedef struct {
    uint8_t *data;
    size_t len, cap;
    uint32_t count;
} fr_buf;

static int fr_reserve(fr_buf *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return 0;
    if (extra > SIZE_MAX / 2 - b->len)
        return -1;
    size_t need = b->len + extra;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    uint8_t *data = (uint8_t *)realloc(b->data, cap);
    if (data == NULL)
        return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

static int fr_put(fr_buf *b, const uint8_t *src, size_t n)
{
    if (n == 0)
        return 0;
    if (fr_reserve(b, n))
        return -1;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static void fr_buf_free(fr_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->count = 0;
}

/* ---- msgpack (the encodings msgspec writes: the shortest form) ---------------------------- */

static size_t mp_uint(uint8_t *out, uint32_t v)
{
    if (v < 0x80) {
        out[0] = (uint8_t)v;
        return 1;
    }
    if (v < 0x100) {
        out[0] = 0xcc;
        out[1] = (uint8_t)v;
        return 2;
    }
    if (v < 0x10000) {
        out[0] = 0xcd;
        out[1] = (uint8_t)(v >> 8);
        out[2] = (uint8_t)v;
        return 3;
    }
    out[0] = 0xce;
    out[1] = (uint8_t)(v >> 24);
    out[2] = (uint8_t)(v >> 16);
    out[3] = (uint8_t)(v >> 8);
    out[4] = (uint8_t)v;
    return 5;
}

static size_t mp_array_header(uint8_t *out, uint32_t n)
{
    if (n < 16) {
        out[0] = (uint8_t)(0x90 | n);
        return 1;
    }
    if (n < 0x10000) {
        out[0] = 0xdc;
        out[1] = (uint8_t)(n >> 8);
        out[2] = (uint8_t)n;
        return 3;
    }
    out[0] = 0xdd;
    out[1] = (uint8_t)(n >> 24);
    out[2] = (uint8_t)(n >> 16);
    out[3] = (uint8_t)(n >> 8);
    out[4] = (uint8_t)n;
    return 5;
}

static size_t mp_str_header(uint8_t *out, uint32_t n)
{
    if (n < 32) {
        out[0] = (uint8_t)(0xa0 | n);
        return 1;
    }
    if (n < 0x100) {
        out[0] = 0xd9;
        out[1] = (uint8_t)n;
        return 2;
    }
    if (n < 0x10000) {
        out[0] = 0xda;
        out[1] = (uint8_t)(n >> 8);
        out[2] = (uint8_t)n;
        return 3;
    }
    out[0] = 0xdb;
    out[1] = (uint8_t)(n >> 24);
    out[2] = (uint8_t)(n >> 16);
    out[3] = (uint8_t)(n >> 8);
    out[4] = (uint8_t)n;
    return 5;
}

/* One TokenDelta, as msgspec encodes TokenDelta(request_id, ids) (array_like, tag "d", detail
 * None): [ "d", request_id, [ids...], nil ]. `rid` is the request id's msgpack str. */
static int mp_token_delta(fr_buf *b, const uint8_t *rid, size_t rid_len, const uint32_t *ids,
                          size_t n)
{
    if (n > UINT32_MAX || n > (SIZE_MAX - rid_len - 16) / 5 || fr_reserve(b, rid_len + 16 + 5 * n))
        return -1;
    uint8_t *out = b->data + b->len;
    uint8_t *start = out;
    *out++ = 0x94;
    *out++ = 0xa1;
    *out++ = 'd';
    memcpy(out, rid, rid_len);
    out += rid_len;
    out += mp_array_header(out, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        out += mp_uint(out, ids[i]);
    *out++ = 0xc0;
    b->len += (size_t)(out - start);
    b->count++;
    return 0;
}

/* ---- protobuf: is a GenerateResponse a plain chunk? --------------------------------------- */

/* A varint of at most 5 bytes in [*pos, end): 0 and its value, or -1 (runs past `end`, or
 * longer). Values up to 2^35 - 1 fit the uint64_t. */
static int pb_varint(const uint8_t *data, size_t *pos, size_t end, uint64_t *value)
{
    uint64_t v = 0;
    size_t p = *pos;
    for (int shift = 0; shift < 35 && p < end; shift += 7) {
        uint8_t byte = data[p++];
        v |= (uint64_t)(byte & 0x7f) << shift;
        if (byte < 0x80) {
            *pos = p;
            *value = v;
            return 0;
        }
    }
    return -1;
}

typedef struct {
    uint32_t *ids;
    size_t n, cap;
} fr_ids;

static int fr_ids_push(fr_ids *ids, uint32_t v)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof(uint32_t))
            return -1;
        uint32_t *grown = (uint32_t *)realloc(ids->ids, cap * sizeof(uint32_t));
        if (grown == NULL)
            return -1;
        ids->ids = grown;
        ids->cap = cap;
    }
    ids->ids[ids->n++] = v;
    return 0;
}

static int pb_count_field(int layout, uint64_t field)
{
    if (field >= 2 && field <= 4)
        return 1; /* prompt_tokens, completion_tokens, cached_tokens */
    if (layout == FR_SGLANG)
        return field == 8 || field == 9; /* index, reasoning_tokens */
    return field == 7;                   /* index */
}

/* 1: a plain chunk, its token ids in `ids`; 0: not one (hand it back); -1: no memory. */
static int pb_plain_chunk(const uint8_t *data, size_t end, int layout, fr_ids *ids)
{
    size_t pos = 0, chunk_start = 0, chunk_end = 0;
    int have_chunk = 0;
    uint64_t tag, size;
    ids->n = 0;
    while (pos < end) {
        if (pb_varint(data, &pos, end, &tag) || (tag & 7) != 2)
            return 0;
        if (pb_varint(data, &pos, end, &size) || size > end - pos)
            return 0;
        uint64_t field = tag >> 3;
        if (field == (uint64_t)layout && !have_chunk) {
            have_chunk = 1;
            chunk_start = pos;
            chunk_end = pos + (size_t)size;
        } else if (field == 1 && layout == FR_SGLANG) {
            for (size_t i = pos; i < pos + (size_t)size; i++)
                if (data[i] >= 0x80)
                    return 0;
        } else {
            return 0;
        }
        pos += (size_t)size;
    }
    if (!have_chunk)
        return 0;
    pos = chunk_start;
    end = chunk_end;
    while (pos < end) {
        uint64_t value;
        if (pb_varint(data, &pos, end, &tag))
            return 0;
        uint64_t field = tag >> 3, wire = tag & 7;
        if (field == 1 && wire == 2) {
            if (pb_varint(data, &pos, end, &size) || size > end - pos)
                return 0;
            size_t stop = pos + (size_t)size;
            while (pos < stop) {
                if (pb_varint(data, &pos, stop, &value) || value > UINT32_MAX)
                    return 0;
                if (fr_ids_push(ids, (uint32_t)value))
                    return -1;
            }
        } else if (field == 1 && wire == 0) {
            if (pb_varint(data, &pos, end, &value) || value > UINT32_MAX)
                return 0;
            if (fr_ids_push(ids, (uint32_t)value))
                return -1;
        } else if (wire == 0 && pb_count_field(layout, field)) {
            if (pb_varint(data, &pos, end, &value))
                return 0;
        } else {
            return 0;
        }
    }
    return 1;
}

/* ---- the reader ----------------------------------------------------------------------- */

typedef struct {
    uint32_t id;
    int layout;
    fr_buf *sink;   /* the batch its deltas go to (its owner keeps it alive: the glue) */
    uint8_t *rid;   /* the request id's msgpack str */
    size_t rid_len;
    fr_buf partial; /* a message split across DATA frames */
    uint64_t received, tokens;
    void *sink_ref, *owner; /* the glue's references (owner: told of the first delta) */
} fr_stream;

#define FR_TOMB ((fr_stream *)1)

typedef struct {
    fr_buf in;
    size_t pos;
    fr_stream **slots; /* open addressing on the stream id; NULL empty, FR_TOMB deleted */
    size_t nslots, used, tombs;
    uint64_t received, refill, max_message, relayed;
    fr_ids ids;
    void **firsts; /* owners whose stream's first delta was written (references moved here) */
    size_t nfirsts, firsts_cap;
} fr_reader;

typedef struct {
    int kind, flags;
    uint32_t stream_id;
    const uint8_t *payload; /* valid until the next fr_next / fr_reader_feed */
    size_t len;
    uint64_t received, tokens, amount;
    fr_stream *gone; /* HANDBACK: the stream, out of the table: the caller frees it */
} fr_event;

static void fr_reader_init(fr_reader *r, uint64_t max_message, uint64_t refill)
{
    memset(r, 0, sizeof(*r));
    r->max_message = max_message;
    r->refill = refill;
}

static size_t fr_slot(const fr_reader *r, uint32_t id)
{
    return (size_t)((id >> 1) * 2654435761u) & (r->nslots - 1);
}

static fr_stream *fr_lookup(const fr_reader *r, uint32_t id)
{
    if (r->used == 0)
        return NULL;
    for (size_t i = fr_slot(r, id);; i = (i + 1) & (r->nslots - 1)) {
        fr_stream *s = r->slots[i];
        if (s == NULL)
            return NULL;
        if (s != FR_TOMB && s->id == id)
            return s;
    }
}

/* Out of the table (not freed). */
static fr_stream *fr_take(fr_reader *r, uint32_t id)
{
    if (r->used == 0)
        return NULL;
    for (size_t i = fr_slot(r, id);; i = (i + 1) & (r->nslots - 1)) {
        fr_stream *s = r->slots[i];
        if (s == NULL)
            return NULL;
        if (s != FR_TOMB && s->id == id) {
            r->slots[i] = FR_TOMB;
            r->used--;
            r->tombs++;
            return s;
        }
    }
}

static int fr_grow(fr_reader *r)
{
    size_t nslots = r->nslots ? r->nslots : 16;
    while ((r->used + 1) * 2 > nslots)
        nslots *= 2;
    fr_stream **slots = (fr_stream **)calloc(nslots, sizeof(fr_stream *));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < r->nslots; i++) {
        fr_stream *s = r->slots[i];
        if (s == NULL || s == FR_TOMB)
            continue;
        size_t j = (size_t)((s->id >> 1) * 2654435761u) & (nslots - 1);
        while (slots[j] != NULL)
            j = (j + 1) & (nslots - 1);
        slots[j] = s;
    }
    free(r->slots);
    r->slots = slots;
    r->nslots = nslots;
    r->tombs = 0;
    return 0;
}

/* Into the table; the caller has taken out any stream of the same id first. */
static int fr_insert(fr_reader *r, fr_stream *s)
{
    if ((r->used + r->tombs + 1) * 2 > r->nslots && fr_grow(r))
        return -1;
    size_t i = fr_slot(r, s->id);
    while (r->slots[i] != NULL && r->slots[i] != FR_TOMB)
        i = (i + 1) & (r->nslots - 1);
    if (r->slots[i] == FR_TOMB)
        r->tombs--;
    r->slots[i] = s;
    r->used++;
    return 0;
}

/* A stream to relay: the request id (`rid`, UTF-8) is copied as a msgpack str. NULL: no
 * memory. */
static fr_stream *fr_stream_new(uint32_t id, int layout, fr_buf *sink, const char *rid,
                                size_t rid_len)
{
    if (rid_len > UINT32_MAX)
        return NULL;
    fr_stream *s = (fr_stream *)calloc(1, sizeof(fr_stream));
    if (s == NULL)
        return NULL;
    s->rid = (uint8_t *)malloc(rid_len + 5);
    if (s->rid == NULL) {
        free(s);
        return NULL;
    }
    size_t head = mp_str_header(s->rid, (uint32_t)rid_len);
    memcpy(s->rid + head, rid, rid_len);
    s->rid_len = head + rid_len;
    s->id = id;
    s->layout = layout;
    s->sink = sink;
    return s;
}

static void fr_stream_free(fr_stream *s)
{
    fr_buf_free(&s->partial);
    free(s->rid);
    free(s);
}

static int fr_reader_feed(fr_reader *r, const uint8_t *data, size_t n)
{
    if (r->pos == r->in.len) {
        r->in.len = r->pos = 0;
    } else if (r->pos > 0) {
        memmove(r->in.data, r->in.data + r->pos, r->in.len - r->pos);
        r->in.len -= r->pos;
        r->pos = 0;
    }
    return fr_put(&r->in, data, n);
}

static uint32_t fr_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void fr_handback(fr_reader *r, fr_stream *s, const uint8_t *data, size_t len,
                        fr_event *ev)
{
    fr_take(r, s->id);
    ev->kind = FR_HANDBACK;
    ev->flags = 0;
    ev->stream_id = s->id;
    ev->payload = data;
    ev->len = len;
    ev->received = s->received;
    ev->tokens = s->tokens;
    ev->gone = s;
}

/* A relayed stream's DATA payload: 0 all relayed (or kept as partial), 1 handed back (`ev`),
 * -1 no memory. */
static int fr_relay_data(fr_reader *r, fr_stream *s, const uint8_t *payload, size_t n,
                         fr_event *ev)
{
    const uint8_t *data = payload;
    size_t size = n, pos = 0;
    if (s->partial.len) {
        if (fr_put(&s->partial, payload, n))
            return -1;
        data = s->partial.data;
        size = s->partial.len;
    }
    while (size - pos >= 5) {
        uint64_t length = fr_be32(data + pos + 1);
        int plain = 0;
        if (data[pos] == 0 && length <= r->max_message) {
            if (length > size - pos - 5)
                break;
            plain = pb_plain_chunk(data + pos + 5, (size_t)length, s->layout, &r->ids);
            if (plain < 0)
                return -1;
        }
        if (!plain) {
            fr_handback(r, s, data + pos, size - pos, ev);
            return 1;
        }
        if (r->ids.n) {
            if (mp_token_delta(s->sink, s->rid, s->rid_len, r->ids.ids, r->ids.n))
                return -1;
            s->tokens += r->ids.n;
            r->relayed++;
            if (s->owner != NULL) {
                if (r->nfirsts == r->firsts_cap) {
                    size_t cap = r->firsts_cap ? r->firsts_cap * 2 : 8;
                    void **grown = (void **)realloc(r->firsts, cap * sizeof(void *));
                    if (grown == NULL)
                        return -1;
                    r->firsts = grown;
                    r->firsts_cap = cap;
                }
                r->firsts[r->nfirsts++] = s->owner;
                s->owner = NULL;
            }
        }
        pos += 5 + (size_t)length;
    }
    if (s->partial.len) {
        memmove(s->partial.data, s->partial.data + pos, size - pos);
        s->partial.len = size - pos;
    } else if (fr_put(&s->partial, data + pos, size - pos)) {
        return -1;
    }
    return 0;
}

static int fr_next(fr_reader *r, fr_event *ev)
{
    memset(ev, 0, sizeof(*ev));
    for (;;) {
        if (r->received >= r->refill) {
            ev->kind = FR_REFILL;
            ev->amount = r->received;
            r->received = 0;
            return 1;
        }
        size_t avail = r->in.len - r->pos;
        if (avail < 9)
            return 0;
        const uint8_t *f = r->in.data + r->pos;
        size_t length = (size_t)f[0] << 16 | (size_t)f[1] << 8 | f[2];
        if (avail - 9 < length)
            return 0;
        int kind = f[3], flags = f[4];
        uint32_t id = fr_be32(f + 5) & 0x7fffffffu;
        fr_stream *s = kind <= FR_HEADERS ? fr_lookup(r, id) : NULL;
        if (s != NULL &&
            ((kind == FR_HEADERS && (flags & FR_END_STREAM)) ||
             (kind == FR_DATA && ((flags & (FR_END_STREAM | FR_PADDED)) ||
                                  s->received + length >= r->refill)))) {
            /* The frame ends the stream: the stream goes back first, the frame comes next. */
            fr_handback(r, s, s->partial.data, s->partial.len, ev);
            return 1;
        }
        r->pos += 9 + length;
        if (kind == FR_DATA) {
            r->received += length;
            if (s != NULL) {
                s->received += length;
                int rc = fr_relay_data(r, s, f + 9, length, ev);
                if (rc)
                    return rc;
                continue;
            }
        }
        ev->kind = kind;
        ev->flags = flags;
        ev->stream_id = id;
        ev->payload = f + 9;
        ev->len = length;
        return 1;
    }
}

#endif
