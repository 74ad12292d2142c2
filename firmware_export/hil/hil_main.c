/* Hardware-in-the-loop target for QEMU's netduinoplus2 (STM32F405): a polled USART1 loop that
 * parses frames (protocol.h), runs the generated policy on each OBS and answers with an ACTION,
 * with a failsafe. Protocol and failsafe: the docstring of deploy/serial_protocol.py.
 *
 * Build-time settings (-D...):
 *   HIL_FAILSAFE_FRAMES  N: failsafe after N missed frames or N consecutive rejected frames
 *   HIL_FRAME_PERIOD_MS  P: the expected OBS period; "missed" = N·P ms without a valid OBS
 *   HIL_IDLE_MS          a partial frame older than this (no byte received) is abandoned
 *   HIL_PRECISION        0 float32, 1 int8 (reported in PONG)
 *   HIL_CONFIG_HASH      the run's config hash, a string literal (reported in PONG)
 * Time: the SysTick down-counter on the core clock (no interrupt), polled: each read adds the
 * ticks elapsed since the previous one (mod 2^24, so the loop must poll at least every 99 ms;
 * a longer stall only lengthens the timeouts). Real time under QEMU without -icount.
 */
#include <string.h>

#include "policy.h"
#include "protocol.h"
#include "uart.h"

#ifndef HIL_FAILSAFE_FRAMES
#define HIL_FAILSAFE_FRAMES 100
#endif
#ifndef HIL_FRAME_PERIOD_MS
#define HIL_FRAME_PERIOD_MS 10
#endif
#ifndef HIL_IDLE_MS
#define HIL_IDLE_MS 50
#endif
#ifndef HIL_PRECISION
#ifdef POLICY_INT8
#define HIL_PRECISION POLICY_INT8
#else
#define HIL_PRECISION 0
#endif
#endif
#ifndef HIL_CONFIG_HASH
#define HIL_CONFIG_HASH ""
#endif

#define CORE_CLOCK_HZ 168000000u
#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)
#define SYST_ENABLE_CORECLK 0x5u
#define SYST_MASK 0xFFFFFFu
#define TICKS_PER_MS (CORE_CLOCK_HZ / 1000u)
#define MOTOR_OFF (-1.0f)

typedef char state_size_matches[(POLICY_STATE_SIZE == HIL_STATE_SIZE) ? 1 : -1];
typedef char action_size_matches[(POLICY_ACTION_SIZE == HIL_ACTION_SIZE) ? 1 : -1];

static struct {
    hil_parser parser;
    uint16_t tx_seq;
    uint16_t rx_errors;       /* frames rejected since boot (wraps) */
    uint16_t bad_streak;      /* consecutive rejections since the last valid OBS */
    uint16_t last_obs_seq;
    uint16_t selftest_failures;
    uint8_t armed, failsafe, reason;
    uint32_t now_ms, last_obs_ms;
    uint32_t last_cvr, ticks; /* SysTick value at the previous read; ticks not yet in now_ms */
    float motors[HIL_ACTION_SIZE]; /* the command applied now, in [-1, 1] */
} hil;

static void clock_start(void) {
    SYST_RVR = SYST_MASK;
    SYST_CVR = 0;
    SYST_CSR = SYST_ENABLE_CORECLK;
    hil.last_cvr = SYST_CVR & SYST_MASK;
}

static uint32_t clock_ms(void) {
    uint32_t cvr = SYST_CVR & SYST_MASK;
    hil.ticks += (hil.last_cvr - cvr) & SYST_MASK; /* a down-counter */
    hil.last_cvr = cvr;
    hil.now_ms += hil.ticks / TICKS_PER_MS;
    hil.ticks %= TICKS_PER_MS;
    return hil.now_ms;
}

static void send(uint8_t type, const uint8_t *payload, uint16_t length) {
    uint8_t frame[HIL_MAX_FRAME];
    size_t n = hil_encode_frame(frame, type, hil.tx_seq++, payload, length);
    uart_write(frame, (uint32_t)n);
}

static uint8_t flags(void) {
    return (uint8_t)((hil.failsafe ? HIL_FLAG_FAILSAFE : 0) |
                     (hil.selftest_failures ? HIL_FLAG_SELFTEST_FAILED : 0) |
                     (hil.armed ? HIL_FLAG_ARMED : 0));
}

static void send_status(uint8_t type, uint16_t echo_seq) {
    hil_status s;
    uint8_t payload[HIL_STATUS_SIZE];
    s.echo_seq = echo_seq;
    s.flags = flags();
    s.reason = hil.reason;
    s.rx_errors = hil.rx_errors;
    memcpy(s.action, hil.motors, sizeof s.action);
    hil_pack_status(&s, payload);
    send(type, payload, HIL_STATUS_SIZE);
}

static void send_pong(uint16_t echo_seq) {
    hil_pong p;
    uint8_t payload[HIL_PONG_SIZE];
    static const char hash[] = HIL_CONFIG_HASH;
    memset(&p, 0, sizeof p);
    p.echo_seq = echo_seq;
    p.version = HIL_PROTOCOL_VERSION;
    p.precision = HIL_PRECISION;
    p.state_size = POLICY_STATE_SIZE;
    p.action_size = POLICY_ACTION_SIZE;
    p.history = POLICY_HISTORY;
    p.flags = flags();
    p.failsafe_frames = HIL_FAILSAFE_FRAMES;
    p.frame_period_ms = HIL_FRAME_PERIOD_MS;
    p.selftest_failures = hil.selftest_failures;
    memcpy(p.config_hash, hash, sizeof hash - 1 < HIL_HASH_SIZE ? sizeof hash - 1 : HIL_HASH_SIZE);
    hil_pack_pong(&p, payload);
    send(HIL_PONG, payload, HIL_PONG_SIZE);
}

static void motors_off(void) {
    for (unsigned i = 0; i < HIL_ACTION_SIZE; i++) hil.motors[i] = MOTOR_OFF;
}

static void enter_failsafe(uint8_t reason) {
    hil.failsafe = 1;
    hil.reason = reason;
    motors_off();
    send_status(HIL_FAILSAFE, hil.last_obs_seq);
}

static void reject(int code, int type, int32_t seq) {
    uint8_t payload[HIL_ERROR_SIZE];
    hil.rx_errors++;
    hil_pack_error((uint16_t)(seq < 0 ? 0 : seq), (uint8_t)code, (uint8_t)(type < 0 ? 0 : type),
                   payload);
    send(HIL_ERROR, payload, HIL_ERROR_SIZE);
    if (hil.armed && !hil.failsafe && ++hil.bad_streak >= HIL_FAILSAFE_FRAMES)
        enter_failsafe(HIL_REASON_BAD_FRAMES);
}

static void on_event(void *ctx, const hil_event *ev) {
    (void)ctx;
    if (ev->code != HIL_OK) {
        reject(ev->code, ev->type, ev->seq);
        return;
    }
    uint16_t seq = (uint16_t)ev->seq;
    if (ev->type == HIL_PING) {
        send_pong(seq);
    } else if (ev->type == HIL_RESET) {
        policy_reset();
        hil.armed = hil.failsafe = hil.reason = 0;
        hil.bad_streak = 0;
        motors_off();
        send_status(HIL_RESET_ACK, seq);
    } else if (ev->type == HIL_OBS) {
        hil.armed = 1;
        hil.bad_streak = 0;
        hil.last_obs_seq = seq;
        hil.last_obs_ms = hil.now_ms;
        if (!hil.failsafe) {
            float state[HIL_STATE_SIZE];
            hil_unpack_obs(ev->payload, state);
            policy_control(state, hil.motors);
        }
        send_status(HIL_ACTION, seq);
    } else {
        reject(HIL_UNEXPECTED, ev->type, ev->seq);
    }
}

int main(void) {
    uart_init();
    clock_start();
    policy_init();
    hil.selftest_failures = (uint16_t)policy_test();
    policy_reset();
    motors_off();
    hil_parser_init(&hil.parser, 1);
    uint32_t last_byte = 0;
    for (;;) {
        int c = uart_getc_nonblocking();
        uint32_t now = clock_ms();
        if (c >= 0) {
            uint8_t byte = (uint8_t)c;
            hil_parser_feed(&hil.parser, &byte, 1, on_event, 0);
            last_byte = now;
            continue;
        }
        if (hil.parser.len && now - last_byte > HIL_IDLE_MS)
            hil_parser_idle(&hil.parser, on_event, 0);
        if (hil.armed && !hil.failsafe &&
            now - hil.last_obs_ms > (uint32_t)HIL_FAILSAFE_FRAMES * HIL_FRAME_PERIOD_MS)
            enter_failsafe(HIL_REASON_TIMEOUT);
    }
}
