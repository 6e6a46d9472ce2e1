/* libFuzzer harness for the engine-connection frame reader (engines/_frames_core.h): the C
 * that reads bytes an engine (or anything on the network posing as one) sends.
 *
 * The input's first two bytes choose the limits and which streams are relayed; the rest is
 * what the connection reads, cut into reads by length bytes taken from the input itself.
 * Events are taken as the Python glue takes them (a handback frees its stream); streams are
 * relayed again, forgotten and their batches taken as the connection and the outbox would.
 * Besides what ASan/UBSan catch, it checks that every batch holds well-formed TokenDeltas
 * and that the reader's count of them is right.
 *
 *   make fuzz                    (builds with clang -fsanitize=fuzzer,address,undefined)
 */
#include <stdio.h>

#include "../engines/_frames_core.h"

#define STREAMS 4

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "frames_fuzz: %s\n", what);
        abort();
    }
}

/* A batch holds `count` TokenDeltas: [ "d", str, [uint...], nil ]. */
static void check_batch(const fr_buf *b)
{
    size_t p = 0;
    for (uint32_t i = 0; i < b->count; i++) {
        check(b->len - p >= 3 && b->data[p] == 0x94 && b->data[p + 1] == 0xa1 &&
                  b->data[p + 2] == 'd',
              "delta head");
        p += 3;
        check(p < b->len, "rid");
        uint8_t h = b->data[p];
        size_t n;
        if ((h & 0xe0) == 0xa0) {
            n = h & 0x1f;
            p += 1;
        } else {
            check(h == 0xd9 && b->len - p >= 2, "rid header");
            n = b->data[p + 1];
            p += 2;
        }
        check(b->len - p >= n, "rid bytes");
        p += n;
        check(p < b->len, "ids");
        h = b->data[p];
        size_t ids;
        if ((h & 0xf0) == 0x90) {
            ids = h & 0x0f;
            p += 1;
        } else {
            check(h == 0xdc && b->len - p >= 3, "ids header");
            ids = (size_t)b->data[p + 1] << 8 | b->data[p + 2];
            check(ids >= 16, "ids header not shortest");
            p += 3;
        }
        for (size_t k = 0; k < ids; k++) {
            check(p < b->len, "id");
            uint8_t c = b->data[p];
            size_t w = c < 0x80 ? 1 : c == 0xcc ? 2 : c == 0xcd ? 3 : c == 0xce ? 5 : 0;
            check(w != 0 && b->len - p >= w, "id width");
            p += w;
        }
        check(p < b->len && b->data[p] == 0xc0, "nil detail");
        p += 1;
    }
    check(p == b->len, "batch length");
}

static const char *RIDS[STREAMS] = {"r", "chatcmpl-0123456789abcdef0123456789abcdef", "", "x"};

static void relay(fr_reader *r, fr_buf *sinks, uint32_t id, int layout, int owned)
{
    size_t i = (id >> 1) % STREAMS;
    fr_stream *old = fr_take(r, id);
    if (old != NULL)
        fr_stream_free(old);
    fr_stream *s = fr_stream_new(id, layout, &sinks[i], RIDS[i], strlen(RIDS[i]));
    check(s != NULL, "no memory");
    s->owner = owned ? (void *)&sinks[i] : NULL;
    check(fr_insert(r, s) == 0, "no memory");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint64_t MAX_MESSAGE[4] = {0, 8, 64, 1 << 20};
    static const uint64_t REFILL[4] = {1, 7, 100, 1u << 30};
    if (size < 2)
        return 0;
    fr_reader r;
    fr_reader_init(&r, MAX_MESSAGE[data[0] & 3], REFILL[(data[0] >> 2) & 3]);
    fr_buf sinks[STREAMS];
    memset(sinks, 0, sizeof(sinks));
    for (uint32_t i = 0; i < STREAMS; i++)
        if (data[1] >> i & 1)
            relay(&r, sinks, 2 * i + 1, (data[1] >> (i + 4)) & 1 ? FR_SGLANG : FR_VLLM, i & 1);
    uint64_t deltas = 0, taken = 0;
    size_t pos = 2;
    while (pos < size) {
        size_t n = data[pos++] % 48 + 1;
        if (n > size - pos)
            n = size - pos;
        check(fr_reader_feed(&r, data + pos, n) == 0, "no memory");
        pos += n;
        fr_event ev;
        int rc;
        uint32_t again = 0; /* a stream handed back, relayed again once this read is taken */
        while ((rc = fr_next(&r, &ev)) == 1) {
            if (ev.len) { /* the glue copies the payload: every byte must be readable */
                volatile uint8_t sum = 0;
                for (size_t i = 0; i < ev.len; i++)
                    sum ^= ev.payload[i];
                (void)sum;
            }
            if (ev.kind == FR_HANDBACK) {
                check(fr_lookup(&r, ev.stream_id) == NULL, "handed back but still relayed");
                fr_stream_free(ev.gone);
                if (ev.stream_id % 4 == 1)
                    again = ev.stream_id;
            } else if (ev.kind == FR_HEADERS && (ev.flags & FR_END_STREAM)) {
                fr_stream *s = fr_take(&r, ev.stream_id); /* the stream ended: forgotten */
                if (s != NULL)
                    fr_stream_free(s);
            } else if (ev.kind == FR_REFILL) {
                check(ev.amount >= r.refill, "refill below the mark");
            }
        }
        check(rc == 0, "no memory");
        if (again)
            relay(&r, sinks, again, FR_SGLANG, 1);
        r.nfirsts = 0; /* owners are the sinks themselves: nothing to release */
        if (pos < size && data[pos - 1] & 0x10) { /* the outbox flushes one batch */
            fr_buf *b = &sinks[data[pos - 1] % STREAMS];
            check_batch(b);
            taken += b->count;
            b->len = 0;
            b->count = 0;
        }
    }
    for (size_t i = 0; i < STREAMS; i++) {
        check_batch(&sinks[i]);
        deltas += sinks[i].count;
    }
    check(deltas + taken == r.relayed, "relayed count");
    for (size_t i = 0; i < r.nslots; i++)
        if (r.slots[i] != NULL && r.slots[i] != FR_TOMB)
            fr_stream_free(r.slots[i]);
    free(r.slots);
    free(r.firsts);
    free(r.ids.ids);
    fr_buf_free(&r.in);
    for (size_t i = 0; i < STREAMS; i++)
        fr_buf_free(&sinks[i]);
    return 0;
}
