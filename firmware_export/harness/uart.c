#include "uart.h"

#define USART1_BASE 0x40011000u
#define USART_SR (*(volatile uint32_t *)(USART1_BASE + 0x00u))
#define USART_DR (*(volatile uint32_t *)(USART1_BASE + 0x04u))
#define USART_BRR (*(volatile uint32_t *)(USART1_BASE + 0x08u))
#define USART_CR1 (*(volatile uint32_t *)(USART1_BASE + 0x0Cu))
#define SR_RXNE (1u << 5)
#define SR_TXE (1u << 7)
#define CR1_RE (1u << 2)
#define CR1_TE (1u << 3)
#define CR1_UE (1u << 13)
#define BRR_115200_AT_84MHZ 0x2D9u /* 84e6 / (16 * 115200) = 45.57: mantissa 45, fraction 9 */

void uart_init(void) {
  USART_BRR = BRR_115200_AT_84MHZ;
  USART_CR1 = CR1_UE | CR1_TE | CR1_RE;
}

void uart_putc(uint8_t byte) {
  while (!(USART_SR & SR_TXE)) {
  }
  USART_DR = byte;
}

void uart_write(const uint8_t *bytes, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) uart_putc(bytes[i]);
}

int uart_getc_nonblocking(void) {
  return (USART_SR & SR_RXNE) ? (int)(USART_DR & 0xFFu) : -1;
}

int uart_getc_timeout(uint32_t spins) {
  for (uint32_t i = 0; i < spins; i++) {
    int byte = uart_getc_nonblocking();
    if (byte >= 0) return byte;
  }
  return -1;
}
