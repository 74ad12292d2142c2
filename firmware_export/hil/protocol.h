/* Hardware-in-the-loop serial protocol: frame encoder, payload codecs and an incremental parser.
 *
 * The specification is the docstring of deploy/serial_protocol.py (the Python twin, which a
 * differential test holds byte- and event-identical to this file). Summary of a frame, integers
 * little-endian: A5 5A | type u8 | seq u16 | length u16 | payload | CRC-16/CCITT-FALSE u16 over
 * type..payload. C99, no malloc, no libc beyond <stdint.h>/<stddef.h>/<string.h>.
 */
#ifndef HIL_PROTOCOL_H
#define HIL_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#define HIL_SYNC0 0xA5u
#define HIL_SYNC1 0x5Au
#define HIL_HEADER_SIZE 7u
#define HIL_CRC_SIZE 2u
#define HIL_MAX_PAYLOAD 128u
#define HIL_MAX_FRAME (HIL_HEADER_SIZE + HIL_MAX_PAYLOAD + HIL_CRC_SIZE)
#define HIL_PROTOCOL_VERSION 1u
#define HIL_STATE_SIZE 18u
#define HIL_ACTION_SIZE 4u
#define HIL_HASH_SIZE 16u

#define HIL_OBS_SIZE (4u * HIL_STATE_SIZE)
#define HIL_STATUS_SIZE (6u + 4u * HIL_ACTION_SIZE)
#define HIL_PONG_SIZE (14u + HIL_HASH_SIZE)
#define HIL_ERROR_SIZE 4u

enum hil_type {
    HIL_PING = 0x01,
    HIL_RESET = 0x02,
    HIL_OBS = 0x03,
    HIL_PONG = 0x81,
    HIL_RESET_ACK = 0x82,
    HIL_ACTION = 0x83,
    HIL_FAILSAFE = 0x84,
    HIL_ERROR = 0xEE
};

enum hil_error_code {
    HIL_OK = 0,
    HIL_BAD_CRC = 1,
    HIL_OVERSIZE = 2,
    HIL_UNKNOWN_TYPE = 3,
    HIL_BAD_LENGTH = 4,
    HIL_STALE_SEQ = 5,
    HIL_TRUNCATED = 6,
    HIL_UNEXPECTED = 7
};

enum hil_flag { HIL_FLAG_FAILSAFE = 1, HIL_FLAG_SELFTEST_FAILED = 2, HIL_FLAG_ARMED = 4 };
enum hil_reason { HIL_REASON_NONE = 0, HIL_REASON_TIMEOUT = 1, HIL_REASON_BAD_FRAMES = 2 };

/* One parser event: a frame (code == HIL_OK) or a rejected candidate. For a rejection, type and
 * seq are as read from its header (-1 when the header was incomplete). `payload` points into the
 * parser's buffer and is valid only during the callback. `offset`: stream offset (mod 2^32) of
 * the candidate's first SYNC byte. */
typedef struct {
    int code;
    int type;
    int32_t seq;
    uint32_t offset;
    const uint8_t *payload;
    uint16_t length;
} hil_event;

typedef void (*hil_event_fn)(void *ctx, const hil_event *ev);

typedef struct {
    uint8_t buf[HIL_MAX_FRAME];
    uint16_t len;      /* bytes buffered, always < HIL_MAX_FRAME between calls */
    uint32_t offset;   /* stream offset of buf[0] */
    uint16_t last_seq; /* seq of the last accepted frame, valid when have_seq */
    uint8_t have_seq;
    uint8_t check_seq;
} hil_parser;

/* Payload of ACTION, RESET_ACK and FAILSAFE. */
typedef struct {
    uint16_t echo_seq;
    uint8_t flags;
    uint8_t reason;
    uint16_t rx_errors;
    float action[HIL_ACTION_SIZE];
} hil_status;

/* Payload of PONG. config_hash is NUL-padded ASCII. */
typedef struct {
    uint16_t echo_seq;
    uint8_t version, precision, state_size, action_size, history, flags;
    uint16_t failsafe_frames, frame_period_ms, selftest_failures;
    char config_hash[HIL_HASH_SIZE];
} hil_pong;

uint16_t hil_crc16(const uint8_t *data, size_t n, uint16_t crc);
/* 1 if seq follows last: 0 < (seq - last) mod 2^16 < 2^15. */
int hil_seq_newer(uint16_t seq, uint16_t last);
/* Payload size of a known type, -1 for an unknown one. */
int hil_payload_size(int type);

/* Writes a whole frame into out (HIL_MAX_FRAME bytes); returns its size, 0 for an unknown type
 * or a length that is not the type's. */
size_t hil_encode_frame(uint8_t *out, uint8_t type, uint16_t seq, const uint8_t *payload,
                        uint16_t length);

void hil_pack_obs(const float state[HIL_STATE_SIZE], uint8_t out[HIL_OBS_SIZE]);
void hil_unpack_obs(const uint8_t in[HIL_OBS_SIZE], float state[HIL_STATE_SIZE]);
void hil_pack_status(const hil_status *s, uint8_t out[HIL_STATUS_SIZE]);
void hil_unpack_status(const uint8_t in[HIL_STATUS_SIZE], hil_status *s);
void hil_pack_pong(const hil_pong *p, uint8_t out[HIL_PONG_SIZE]);
void hil_unpack_pong(const uint8_t in[HIL_PONG_SIZE], hil_pong *p);
void hil_pack_error(uint16_t echo_seq, uint8_t code, uint8_t type, uint8_t out[HIL_ERROR_SIZE]);

void hil_parser_init(hil_parser *p, int check_seq);
/* Feeds n bytes; calls fn once per event, in stream order. fn must not feed this parser. */
void hil_parser_feed(hil_parser *p, const uint8_t *data, size_t n, hil_event_fn fn, void *ctx);
/* The line went quiet: abandons any incomplete frame (TRUNCATED) and rescans what is buffered. */
void hil_parser_idle(hil_parser *p, hil_event_fn fn, void *ctx);

#endif
