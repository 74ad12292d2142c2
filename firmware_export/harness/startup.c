/* Cortex-M4 startup for the STM32F405: vector table, reset handler (copies .data, zeroes .bss,
 * enables the FPU), then main(); main's return value becomes the semihosting exit status. */
#include <stdint.h>

#include "semihosting.h"

extern uint32_t _stack_top, _data_load, _data_start, _data_end, _bss_start, _bss_end;
int main(void);
void Reset_Handler(void);
void Default_Handler(void);


#define SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)

void Reset_Handler(void) {
  const uint32_t *src = &_data_load;
  for (uint32_t *dst = &_data_start; dst < &_data_end;) *dst++ = *src++;
  for (uint32_t *dst = &_bss_start; dst < &_bss_end;) *dst++ = 0;
  SCB_CPACR |= 0xFu << 20; /* CP10, CP11 full access: the FPU */
  __asm volatile("dsb\n\tisb" ::: "memory");
  semihosting_exit(main());
}

/* Faults and unexpected interrupts end the run with status 100 (semihosting). */
void Default_Handler(void) {
  semihosting_write0("fault\n");
  semihosting_exit(100);
}

typedef void (*vector_t)(void);

/* Initial SP, 15 system exceptions (reset .. SysTick); device interrupts are not used. */
__attribute__((section(".isr_vector"), used)) static const vector_t vectors[16] = {
    (vector_t)(uintptr_t)&_stack_top,
    Reset_Handler,
    Default_Handler, /* NMI */
    Default_Handler, /* HardFault */
    Default_Handler, /* MemManage */
    Default_Handler, /* BusFault */
    Default_Handler, /* UsageFault */
    0, 0, 0, 0,
    Default_Handler, /* SVCall */
    Default_Handler, /* DebugMonitor */
    0,
    Default_Handler, /* PendSV */
    Default_Handler, /* SysTick */
};
