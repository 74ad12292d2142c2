#include "counter.h"

#define TIM2_BASE 0x40000000u
#define TIM_CR1 (*(volatile uint32_t *)(TIM2_BASE + 0x00u))
#define TIM_EGR (*(volatile uint32_t *)(TIM2_BASE + 0x14u))
#define TIM_CNT (*(volatile uint32_t *)(TIM2_BASE + 0x24u))
#define TIM_PSC (*(volatile uint32_t *)(TIM2_BASE + 0x28u))
#define TIM_ARR (*(volatile uint32_t *)(TIM2_BASE + 0x2Cu))
#define RCC_APB1ENR (*(volatile uint32_t *)0x40023840u)
#define RCC_APB1ENR_TIM2EN 1u

void counter_start(void) {
  RCC_APB1ENR |= RCC_APB1ENR_TIM2EN;
  TIM_CR1 = 0;
  TIM_PSC = 0;
  TIM_ARR = 0xFFFFFFFFu;
  TIM_EGR = 1; /* UG: load the prescaler, clear the count */
  TIM_CNT = 0;
  TIM_CR1 = 1; /* CEN */
}

uint32_t counter_read(void) { return TIM_CNT; }
