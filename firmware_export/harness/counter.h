/* An instruction counter for QEMU's netduinoplus2 run with `-icount shift=0`.
 *
 * With `-icount shift=0` the guest executes one instruction per nanosecond of virtual time. QEMU's
 * STM32F405 timers count at 1 GHz of virtual time, so TIM2 (32-bit, prescaler 0) advances exactly
 * one tick per instruction. SysTick does not: it counts the 168 MHz core clock of virtual time,
 * 0.168 ticks per instruction (measured), too coarse for short code.
 * On hardware, TIM2 counts the 84 MHz APB1 timer clock instead (after RCC enables it): use the
 * DWT cycle counter there; QEMU does not emulate it. */
#ifndef HOVERFLY_COUNTER_H
#define HOVERFLY_COUNTER_H

#include <stdint.h>

void counter_start(void);    /* TIM2 free-running from 0 */
uint32_t counter_read(void); /* instructions since counter_start (wraps after 2^32) */

#endif
