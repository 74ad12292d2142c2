/* Host build of the HIL protocol for tests (gcc -fsanitize=address,undefined):
 *
 *   host_driver fuzz ITERATIONS SEED   deterministic random-mutation fuzzing of the parser with
 *                                      invariant checks; exit 0 and one summary line if all hold
 *   host_driver parse [CHUNK] [noseq]  parses stdin (fed CHUNK bytes at a time, then idle) and
 *                                      prints one line per event (differential test vs Python)
 *   host_driver encode                 reads lines `raw|obs|status|pong|error ...` (see
 *                                      encode_line) and writes the frames to stdout
 *
 * Event lines: `F offset type seq payload-hex` (+ a decoded line for known payloads) and
 * `E offset code type seq`. Floats travel as the hex of their IEEE-754 bits.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol.h"

#define STREAM_MAX 4096
#define EVENTS_MAX 4096
#define PLANTS_MAX 256

static void fail(const char *what, uint64_t iteration) {
    fprintf(stderr, "invariant violated at iteration %" PRIu64 ": %s\n", iteration, what);
    abort();
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* -- fuzz ------------------------------------------------------------------------------------- */
static uint64_t rng = 1;

static uint32_t rnd(void) { /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 2685821657736338717ull) >> 32);
}

static const uint8_t TYPES[] = {HIL_PING, HIL_RESET, HIL_OBS,      HIL_PONG,
                                HIL_RESET_ACK, HIL_ACTION, HIL_FAILSAFE, HIL_ERROR};

typedef struct {
    uint32_t offset;
    uint16_t size;
} plant;

typedef struct {
    hil_event ev; /* payload pointer cleared: the buffer moves on */
    uint16_t total;
} record;

static uint8_t stream[STREAM_MAX];
static size_t slen;
static plant plants[PLANTS_MAX];
static int nplants;
static record events[EVENTS_MAX];
static int nevents;

static void put(const uint8_t *b, size_t n) {
    if (slen + n <= STREAM_MAX) {
        memcpy(stream + slen, b, n);
        slen += n;
    }
}

static size_t random_frame(uint8_t *out, uint16_t *seq) {
    uint8_t type = TYPES[rnd() % sizeof TYPES];
    uint8_t payload[HIL_MAX_PAYLOAD];
    int size = hil_payload_size(type);
    for (int i = 0; i < size; i++) payload[i] = (uint8_t)rnd();
    uint32_t r = rnd() % 8;
    *seq = (uint16_t)(r == 0 ? *seq - rnd() % 3 : *seq + 1 + (r == 1 ? rnd() : 0) % 40000);
    return hil_encode_frame(out, type, *seq, payload, (uint16_t)size);
}

static void mutate(uint8_t *f, size_t *n) {
    size_t at = rnd() % *n;
    switch (rnd() % 5) {
        case 0: f[at] ^= (uint8_t)(1u << (rnd() % 8)); break;        /* bit flip */
        case 1: f[at] = (uint8_t)rnd(); f[(at + 1) % *n] ^= 0x10; break; /* byte burst */
        case 2: memmove(f + at, f + at + 1, *n - at - 1); (*n)--; break; /* deletion */
        case 3: *n = at; break;                                      /* truncation */
        default: /* length field */
            f[5] = (uint8_t)rnd();
            f[6] = (uint8_t)(rnd() % 3);
    }
}

static void build_stream(void) {
    slen = 0;
    nplants = 0;
    uint16_t seq = (uint16_t)rnd();
    int pieces = 1 + (int)(rnd() % 16);
    for (int k = 0; k < pieces; k++) {
        uint8_t buf[HIL_MAX_FRAME + 64];
        size_t n = 0;
        uint32_t kind = rnd() % 8;
        if (kind < 2) { /* garbage, rich in SYNC bytes */
            n = rnd() % 48;
            for (size_t i = 0; i < n; i++) {
                uint32_t r = rnd() % 4;
                buf[i] = r == 0 ? HIL_SYNC0 : r == 1 ? HIL_SYNC1 : (uint8_t)rnd();
            }
            put(buf, n);
        } else if (kind < 6) { /* intact frame */
            n = random_frame(buf, &seq);
            if (slen + n <= STREAM_MAX && nplants < PLANTS_MAX)
                plants[nplants++] = (plant){(uint32_t)slen, (uint16_t)n};
            put(buf, n);
        } else { /* damaged frame */
            n = random_frame(buf, &seq);
            mutate(buf, &n);
            put(buf, n);
        }
    }
}

static void on_event(void *ctx, const hil_event *ev) {
    (void)ctx;
    if (nevents >= EVENTS_MAX) return;
    record r = {*ev, 0};
    r.ev.payload = 0;
    if (ev->code == HIL_OK || ev->code == HIL_STALE_SEQ)
        r.total = (uint16_t)(HIL_HEADER_SIZE + (unsigned)hil_payload_size(ev->type) + HIL_CRC_SIZE);
    if (ev->code == HIL_OK) { /* the frame re-encodes to the very bytes at its offset */
        uint8_t again[HIL_MAX_FRAME];
        size_t n = hil_encode_frame(again, (uint8_t)ev->type, (uint16_t)ev->seq, ev->payload,
                                    ev->length);
        if (n != r.total || ev->offset + n > slen || memcmp(again, stream + ev->offset, n))
            fail("accepted frame differs from the stream bytes", 0);
    }
    events[nevents++] = r;
}

static void check_events(uint64_t it, const hil_parser *p) {
    int have = 0;
    uint16_t last = 0;
    for (int i = 0; i < nevents; i++) {
        const hil_event *e = &events[i].ev;
        if (i && e->offset <= events[i - 1].ev.offset) fail("event offsets not increasing", it);
        if (e->code == HIL_TRUNCATED) {
            int need = HIL_HEADER_SIZE;
            if (e->type >= 0) need += hil_payload_size(e->type) + (int)HIL_CRC_SIZE;
            if (e->offset + (size_t)need <= slen) fail("TRUNCATED inside the stream", it);
        }
        if (e->code == HIL_BAD_CRC) {
            const uint8_t *f = stream + e->offset;
            size_t body = HIL_HEADER_SIZE - 2 + (size_t)hil_payload_size(e->type);
            if (hil_crc16(f + 2, body, 0xFFFFu) == (f[2 + body] | (f[3 + body] << 8)))
                fail("BAD_CRC on a good CRC", it);
        }
        if (e->code == HIL_OVERSIZE && (stream[e->offset + 5] | (stream[e->offset + 6] << 8)) <=
                                           (int)HIL_MAX_PAYLOAD)
            fail("OVERSIZE on a legal length", it);
        if (e->code == HIL_OK || e->code == HIL_STALE_SEQ) { /* independent model of the window */
            uint16_t s = (uint16_t)e->seq;
            int session = e->type == HIL_PING || e->type == HIL_PONG;
            uint16_t d = (uint16_t)(s - last);
            int fresh = !p->check_seq || session || !have || (d != 0 && d < 0x8000u);
            if (fresh != (e->code == HIL_OK)) fail("sequence window decision", it);
            if (fresh) last = s, have = 1;
        }
    }
    for (int k = 0; k < nplants; k++) { /* every intact frame is found, unless a spurious
                                           CRC-valid frame overlapping it was taken first */
        int found = 0;
        for (int i = 0; i < nevents && !found; i++) {
            const record *r = &events[i];
            if (!r->total) continue;
            uint32_t a = r->ev.offset, b = a + r->total;
            found = a == plants[k].offset ||
                    (a < plants[k].offset + plants[k].size && plants[k].offset < b);
        }
        if (!found) fail("intact frame lost", it);
    }
    if (p->len != 0) fail("bytes left after idle", it);
}

static int fuzz(uint64_t iterations, uint64_t seed) {
    rng = seed * 0x9E3779B97F4A7C15ull + 1;
    uint64_t frames = 0, errors = 0, bytes = 0;
    for (uint64_t it = 0; it < iterations; it++) {
        build_stream();
        hil_parser p;
        hil_parser_init(&p, (int)(rnd() % 4 != 0));
        nevents = 0;
        for (size_t at = 0; at < slen;) {
            size_t n = 1 + rnd() % 64;
            if (n > slen - at) n = slen - at;
            hil_parser_feed(&p, stream + at, n, on_event, 0);
            if (p.len >= HIL_MAX_FRAME) fail("parser buffer overflow", it);
            at += n;
        }
        hil_parser_idle(&p, on_event, 0);
        check_events(it, &p);
        for (int i = 0; i < nevents; i++) *(events[i].ev.code == HIL_OK ? &frames : &errors) += 1;
        bytes += slen;
    }
    printf("fuzz ok: %" PRIu64 " iterations, %" PRIu64 " bytes, %" PRIu64 " frames, %" PRIu64
           " rejections\n",
           iterations, bytes, frames, errors);
    return 0;
}

/* -- parse (differential) --------------------------------------------------------------------- */
static void print_event(void *ctx, const hil_event *ev) {
    (void)ctx;
    if (ev->code != HIL_OK) {
        printf("E %" PRIu32 " %d %d %" PRId32 "\n", ev->offset, ev->code, ev->type, ev->seq);
        return;
    }
    printf("F %" PRIu32 " %d %" PRId32 " ", ev->offset, ev->type, ev->seq);
    for (uint16_t i = 0; i < ev->length; i++) printf("%02x", ev->payload[i]);
    printf("\n");
    if (ev->type == HIL_OBS) {
        float s[HIL_STATE_SIZE];
        hil_unpack_obs(ev->payload, s);
        printf("obs");
        for (unsigned i = 0; i < HIL_STATE_SIZE; i++) printf(" %08" PRIx32, f32_bits(s[i]));
        printf("\n");
    } else if (ev->type == HIL_ACTION || ev->type == HIL_RESET_ACK || ev->type == HIL_FAILSAFE) {
        hil_status s;
        hil_unpack_status(ev->payload, &s);
        printf("status %u %u %u %u", s.echo_seq, s.flags, s.reason, s.rx_errors);
        for (unsigned i = 0; i < HIL_ACTION_SIZE; i++) printf(" %08" PRIx32, f32_bits(s.action[i]));
        printf("\n");
    } else if (ev->type == HIL_PONG) {
        hil_pong q;
        hil_unpack_pong(ev->payload, &q);
        printf("pong %u %u %u %u %u %u %u %u %u %u ", q.echo_seq, q.version, q.precision,
               q.state_size, q.action_size, q.history, q.flags, q.failsafe_frames,
               q.frame_period_ms, q.selftest_failures);
        for (unsigned i = 0; i < HIL_HASH_SIZE; i++) printf("%02x", (uint8_t)q.config_hash[i]);
        printf("\n");
    }
}

static int parse(size_t chunk, int check_seq) {
    static uint8_t in[1 << 20];
    size_t n = fread(in, 1, sizeof in, stdin);
    hil_parser p;
    hil_parser_init(&p, check_seq);
    for (size_t at = 0; at < n; at += chunk)
        hil_parser_feed(&p, in + at, at + chunk <= n ? chunk : n - at, print_event, 0);
    hil_parser_idle(&p, print_event, 0);
    return 0;
}

/* -- encode (differential) -------------------------------------------------------------------- */
static int read_hex(const char *hex, uint8_t *out, size_t max) {
    size_t n = strlen(hex);
    if (n % 2 || n / 2 > max) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (uint8_t)v;
    }
    return (int)(n / 2);
}

/* raw TYPE SEQ [HEX] | obs SEQ 18×BITS | status TYPE SEQ ECHO FLAGS REASON RX 4×BITS |
 * pong SEQ ECHO VER PREC SS AS HIST FLAGS FSF PERIOD SELFTEST HASHHEX | error SEQ ECHO CODE TYPE */
static int encode_line(char *line) {
    uint8_t payload[HIL_MAX_PAYLOAD], frame[HIL_MAX_FRAME];
    unsigned type = 0, seq = 0, v[12];
    char word[16], hex[2 * HIL_MAX_PAYLOAD + 1] = "";
    int len = -1, used = 0;
    if (sscanf(line, "%15s%n", word, &used) != 1) return 0;
    char *rest = line + used;
    if (!strcmp(word, "raw") && sscanf(rest, "%u %u %256s", &type, &seq, hex) >= 2) {
        len = read_hex(hex, payload, sizeof payload);
    } else if (!strcmp(word, "obs") && sscanf(rest, "%u%n", &seq, &used) == 1) {
        float s[HIL_STATE_SIZE];
        rest += used;
        for (unsigned i = 0; i < HIL_STATE_SIZE; i++) {
            uint32_t bits;
            if (sscanf(rest, "%" SCNx32 "%n", &bits, &used) != 1) return -1;
            s[i] = bits_f32(bits);
            rest += used;
        }
        type = HIL_OBS;
        hil_pack_obs(s, payload);
        len = HIL_OBS_SIZE;
    } else if (!strcmp(word, "status") &&
               sscanf(rest, "%u %u %u %u %u %u%n", &type, &seq, &v[0], &v[1], &v[2], &v[3],
                      &used) == 6) {
        hil_status s = {(uint16_t)v[0], (uint8_t)v[1], (uint8_t)v[2], (uint16_t)v[3], {0}};
        rest += used;
        for (unsigned i = 0; i < HIL_ACTION_SIZE; i++) {
            uint32_t bits;
            if (sscanf(rest, "%" SCNx32 "%n", &bits, &used) != 1) return -1;
            s.action[i] = bits_f32(bits);
            rest += used;
        }
        hil_pack_status(&s, payload);
        len = HIL_STATUS_SIZE;
    } else if (!strcmp(word, "pong") &&
               sscanf(rest, "%u %u %u %u %u %u %u %u %u %u %u %34s", &seq, &v[0], &v[1], &v[2],
                      &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], hex) == 12) {
        hil_pong q = {(uint16_t)v[0], (uint8_t)v[1], (uint8_t)v[2], (uint8_t)v[3],
                      (uint8_t)v[4],  (uint8_t)v[5], (uint8_t)v[6], (uint16_t)v[7],
                      (uint16_t)v[8], (uint16_t)v[9], {0}};
        if (read_hex(hex, (uint8_t *)q.config_hash, HIL_HASH_SIZE) != (int)HIL_HASH_SIZE) return -1;
        type = HIL_PONG;
        hil_pack_pong(&q, payload);
        len = HIL_PONG_SIZE;
    } else if (!strcmp(word, "error") &&
               sscanf(rest, "%u %u %u %u", &seq, &v[0], &v[1], &v[2]) == 4) {
        type = HIL_ERROR;
        hil_pack_error((uint16_t)v[0], (uint8_t)v[1], (uint8_t)v[2], payload);
        len = HIL_ERROR_SIZE;
    }
    if (len < 0) return -1;
    size_t n = hil_encode_frame(frame, (uint8_t)type, (uint16_t)seq, payload, (uint16_t)len);
    if (!n) return -1;
    fwrite(frame, 1, n, stdout);
    return 0;
}

static int encode(void) {
    char line[4096];
    while (fgets(line, sizeof line, stdin))
        if (encode_line(line)) {
            fprintf(stderr, "bad encode line: %s", line);
            return 1;
        }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "fuzz"))
        return fuzz(strtoull(argv[2], 0, 10), strtoull(argv[3], 0, 10));
    if (argc >= 2 && !strcmp(argv[1], "parse"))
        return parse(argc > 2 && atoi(argv[2]) > 0 ? (size_t)atoi(argv[2]) : 1,
                     !(argc > 3 && !strcmp(argv[3], "noseq")));
    if (argc == 2 && !strcmp(argv[1], "encode")) return encode();
    fprintf(stderr, "usage: %s fuzz ITERATIONS SEED | parse [CHUNK] [noseq] | encode\n", argv[0]);
    return 2;
}
