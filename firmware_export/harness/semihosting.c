#include "semihosting.h"

#include <stdint.h>

#define SYS_WRITE0 0x04
#define SYS_EXIT 0x18
#define SYS_EXIT_EXTENDED 0x20
#define ADP_STOPPED_APPLICATION_EXIT 0x20026

static int semihosting_call(int op, const void *arg) {
  register int r0 __asm("r0") = op;
  register const void *r1 __asm("r1") = arg;
  __asm volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
  return r0;
}

void semihosting_write0(const char *text) { semihosting_call(SYS_WRITE0, text); }

void semihosting_exit(int status) {
  /* reason, subcode: QEMU exits with `status` as its own exit code. */
  const uint32_t block[2] = {ADP_STOPPED_APPLICATION_EXIT, (uint32_t)status};
  semihosting_call(SYS_EXIT_EXTENDED, block);
  /* Hosts without the extended call: plain SYS_EXIT reports only success or failure. */
  semihosting_call(SYS_EXIT, (const void *)(uintptr_t)(status == 0 ? ADP_STOPPED_APPLICATION_EXIT
                                                                      : 0x20023 /* RunTimeError */));
  for (;;) {
  }
}
