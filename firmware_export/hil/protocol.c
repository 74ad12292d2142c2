/* Hardware-in-the-loop serial protocol (see protocol.h and deploy/serial_protocol.py). */
#include "protocol.h"

#include <string.h>

#define NOT_FOUND 0xFFFFu

/* -- little-endian fields ------------------------------------------------------------------ */
static uint16_t get_u16(const uint8_t *b) { return (uint16_t)(b[0] | (b[1] << 8)); }

static void put_u16(uint8_t *b, uint16_t v) {
    b[0] = (uint8_t)(v & 0xFFu);
    b[1] = (uint8_t)(v >> 8);
}

static float get_f32(const uint8_t *b) {
    uint32_t u = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
                 ((uint32_t)b[3] << 24);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void put_f32(uint8_t *b, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(u >> (8 * i));
}

/* -- CRC, sequence window, sizes -------------------------------------------------------------- */
uint16_t hil_crc16(const uint8_t *data, size_t n, uint16_t crc) {
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((unsigned)data[i] << 8);
        for (int bit = 0; bit < 8; bit++)
            crc = (uint16_t)((crc & 0x8000u) ? (((unsigned)crc << 1) ^ 0x1021u) : ((unsigned)crc << 1));
    }
    return crc;
}

int hil_seq_newer(uint16_t seq, uint16_t last) {
    uint16_t d = (uint16_t)(seq - last);
    return d != 0 && d < 0x8000u;
}

int hil_payload_size(int type) {
    switch (type) {
        case HIL_PING:
        case HIL_RESET:
            return 0;
        case HIL_OBS:
            return HIL_OBS_SIZE;
        case HIL_PONG:
            return HIL_PONG_SIZE;
        case HIL_RESET_ACK:
        case HIL_ACTION:
        case HIL_FAILSAFE:
            return HIL_STATUS_SIZE;
        case HIL_ERROR:
            return HIL_ERROR_SIZE;
        default:
            return -1;
    }
}

size_t hil_encode_frame(uint8_t *out, uint8_t type, uint16_t seq, const uint8_t *payload,
                        uint16_t length) {
    if (hil_payload_size(type) != (int)length) return 0;
    out[0] = HIL_SYNC0;
    out[1] = HIL_SYNC1;
    out[2] = type;
    put_u16(out + 3, seq);
    put_u16(out + 5, length);
    if (length) memcpy(out + HIL_HEADER_SIZE, payload, length);
    put_u16(out + HIL_HEADER_SIZE + length, hil_crc16(out + 2, HIL_HEADER_SIZE - 2 + length, 0xFFFFu));
    return HIL_HEADER_SIZE + length + HIL_CRC_SIZE;
}

/* -- payloads --------------------------------------------------------------------------------- */
void hil_pack_obs(const float state[HIL_STATE_SIZE], uint8_t out[HIL_OBS_SIZE]) {
    for (unsigned i = 0; i < HIL_STATE_SIZE; i++) put_f32(out + 4 * i, state[i]);
}

void hil_unpack_obs(const uint8_t in[HIL_OBS_SIZE], float state[HIL_STATE_SIZE]) {
    for (unsigned i = 0; i < HIL_STATE_SIZE; i++) state[i] = get_f32(in + 4 * i);
}

void hil_pack_status(const hil_status *s, uint8_t out[HIL_STATUS_SIZE]) {
    put_u16(out, s->echo_seq);
    out[2] = s->flags;
    out[3] = s->reason;
    put_u16(out + 4, s->rx_errors);
    for (unsigned i = 0; i < HIL_ACTION_SIZE; i++) put_f32(out + 6 + 4 * i, s->action[i]);
}

void hil_unpack_status(const uint8_t in[HIL_STATUS_SIZE], hil_status *s) {
    s->echo_seq = get_u16(in);
    s->flags = in[2];
    s->reason = in[3];
    s->rx_errors = get_u16(in + 4);
    for (unsigned i = 0; i < HIL_ACTION_SIZE; i++) s->action[i] = get_f32(in + 6 + 4 * i);
}

void hil_pack_pong(const hil_pong *p, uint8_t out[HIL_PONG_SIZE]) {
    put_u16(out, p->echo_seq);
    out[2] = p->version;
    out[3] = p->precision;
    out[4] = p->state_size;
    out[5] = p->action_size;
    out[6] = p->history;
    out[7] = p->flags;
    put_u16(out + 8, p->failsafe_frames);
    put_u16(out + 10, p->frame_period_ms);
    put_u16(out + 12, p->selftest_failures);
    memcpy(out + 14, p->config_hash, HIL_HASH_SIZE);
}

void hil_unpack_pong(const uint8_t in[HIL_PONG_SIZE], hil_pong *p) {
    p->echo_seq = get_u16(in);
    p->version = in[2];
    p->precision = in[3];
    p->state_size = in[4];
    p->action_size = in[5];
    p->history = in[6];
    p->flags = in[7];
    p->failsafe_frames = get_u16(in + 8);
    p->frame_period_ms = get_u16(in + 10);
    p->selftest_failures = get_u16(in + 12);
    memcpy(p->config_hash, in + 14, HIL_HASH_SIZE);
}

void hil_pack_error(uint16_t echo_seq, uint8_t code, uint8_t type, uint8_t out[HIL_ERROR_SIZE]) {
    put_u16(out, echo_seq);
    out[2] = code;
    out[3] = type;
}

/* -- parser ----------------------------------------------------------------------------------- */
void hil_parser_init(hil_parser *p, int check_seq) {
    memset(p, 0, sizeof *p);
    p->check_seq = (uint8_t)(check_seq != 0);
}

static void drop(hil_parser *p, uint16_t n) {
    memmove(p->buf, p->buf + n, (size_t)(p->len - n));
    p->len = (uint16_t)(p->len - n);
    p->offset += n;
}

static uint16_t find_sync(const hil_parser *p) {
    for (uint16_t i = 0; i + 1u < p->len; i++)
        if (p->buf[i] == HIL_SYNC0 && p->buf[i + 1] == HIL_SYNC1) return i;
    return NOT_FOUND;
}

/* The candidate frame at buf[0] (a SYNC): emits its event and returns the bytes to drop, or
 * returns 0 to wait for more bytes. */
static uint16_t candidate(hil_parser *p, int flush, hil_event_fn fn, void *ctx) {
    hil_event ev = {HIL_OK, -1, -1, p->offset, 0, 0};
    if (p->len < HIL_HEADER_SIZE) {
        if (!flush) return 0;
        ev.code = HIL_TRUNCATED;
        fn(ctx, &ev);
        return 1;
    }
    ev.type = p->buf[2];
    ev.seq = get_u16(p->buf + 3);
    uint16_t length = get_u16(p->buf + 5);
    uint16_t total = (uint16_t)(HIL_HEADER_SIZE + length + HIL_CRC_SIZE);
    if (length > HIL_MAX_PAYLOAD)
        ev.code = HIL_OVERSIZE;
    else if (hil_payload_size(ev.type) < 0)
        ev.code = HIL_UNKNOWN_TYPE;
    else if (hil_payload_size(ev.type) != (int)length)
        ev.code = HIL_BAD_LENGTH;
    else if (p->len < total) {
        if (!flush) return 0;
        ev.code = HIL_TRUNCATED;
    } else if (hil_crc16(p->buf + 2, total - 2u - HIL_CRC_SIZE, 0xFFFFu) !=
               get_u16(p->buf + total - HIL_CRC_SIZE))
        ev.code = HIL_BAD_CRC;
    if (ev.code != HIL_OK) {
        fn(ctx, &ev);
        return 1;
    }
    uint16_t seq = (uint16_t)ev.seq;
    int session = ev.type == HIL_PING || ev.type == HIL_PONG;
    if (p->check_seq && !session && p->have_seq && !hil_seq_newer(seq, p->last_seq)) {
        ev.code = HIL_STALE_SEQ;
    } else {
        p->last_seq = seq;
        p->have_seq = 1;
        ev.payload = p->buf + HIL_HEADER_SIZE;
        ev.length = length;
    }
    fn(ctx, &ev);
    return total;
}

static void drain(hil_parser *p, int flush, hil_event_fn fn, void *ctx) {
    for (;;) {
        uint16_t start = find_sync(p);
        if (start == NOT_FOUND) {
            /* Keep a trailing first SYNC byte: its partner may come next. */
            int keep = !flush && p->len > 0 && p->buf[p->len - 1] == HIL_SYNC0;
            drop(p, (uint16_t)(p->len - keep));
            return;
        }
        drop(p, start);
        uint16_t used = candidate(p, flush, fn, ctx);
        if (!used) return;
        drop(p, used);
    }
}

void hil_parser_feed(hil_parser *p, const uint8_t *data, size_t n, hil_event_fn fn, void *ctx) {
    for (size_t i = 0; i < n; i++) {
        p->buf[p->len++] = data[i]; /* fits: the buffer holds < HIL_MAX_FRAME between bytes */
        drain(p, 0, fn, ctx);
    }
}

void hil_parser_idle(hil_parser *p, hil_event_fn fn, void *ctx) { drain(p, 1, fn, ctx); }
