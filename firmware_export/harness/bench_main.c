/* QEMU bench of a generated policy: policy_test(), then the instructions of BENCH_CALLS
 * policy_control calls from a reset, each timed alone with the TIM2 instruction counter (counter.h, exact
 * under -icount shift=0), minus the same measurement around an empty function of the same
 * signature. Prints one line through semihosting and exits with the test status:
 *   BENCH failures=<n> calls=<n> control=<total instructions> empty=<total instructions>
 * bench_trace_begin/end bracket the timed loop for the instruction-mix trace (cycles.py). */
#include <stdint.h>

#include "counter.h"
#include "policy.h"
#include "semihosting.h"

#ifndef BENCH_CALLS
#define BENCH_CALLS 100
#endif

__attribute__((noinline)) void bench_empty(const float state[POLICY_STATE_SIZE],
                                           float action[POLICY_ACTION_SIZE]) {
  __asm volatile("" : : "r"(state), "r"(action) : "memory");
}
__attribute__((noinline)) void bench_trace_begin(void) { __asm volatile("" ::: "memory"); }
__attribute__((noinline)) void bench_trace_end(void) { __asm volatile("" ::: "memory"); }

typedef void (*control_fn)(const float *, float *);

/* A pseudo-random state in [-0.5, 0.5) per value (deterministic, varies with the call). */
static void next_state(uint32_t *seed, float state[POLICY_STATE_SIZE]) {
  for (int i = 0; i < POLICY_STATE_SIZE; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    state[i] = (float)(*seed >> 8) * (1.0f / 16777216.0f) - 0.5f;
  }
}

static uint32_t time_calls(control_fn fn) {
  float state[POLICY_STATE_SIZE], action[POLICY_ACTION_SIZE];
  uint32_t seed = 1, total = 0;
  for (int k = 0; k < BENCH_CALLS; k++) {
    next_state(&seed, state);
    uint32_t t0 = counter_read();
    fn(state, action);
    total += counter_read() - t0;
  }
  return total;
}

static char *put_u32(char *out, uint32_t v) {
  char digits[10];
  int n = 0;
  do {
    digits[n++] = (char)('0' + v % 10u);
    v /= 10u;
  } while (v);
  while (n) *out++ = digits[--n];
  return out;
}

static char *put_str(char *out, const char *s) {
  while (*s) *out++ = *s++;
  return out;
}

int main(void) {
  static char line[96];
  policy_init();
  int failures = policy_test();
  counter_start();
  uint32_t empty = time_calls(bench_empty);
  policy_reset();
  bench_trace_begin();
  uint32_t control = time_calls(policy_control);
  bench_trace_end();
  char *p = put_str(line, "BENCH failures=");
  p = put_u32(p, (uint32_t)failures);
  p = put_str(p, " calls=");
  p = put_u32(p, BENCH_CALLS);
  p = put_str(p, " control=");
  p = put_u32(p, control);
  p = put_str(p, " empty=");
  p = put_u32(p, empty);
  p = put_str(p, "\n");
  *p = '\0';
  semihosting_write0(line);
  return failures == 0 ? 0 : 1;
}
