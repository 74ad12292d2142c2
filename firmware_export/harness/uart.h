/* Polled USART1 of the STM32F405 (0x40011000; QEMU -M netduinoplus2 connects it to -serial).
 * Under QEMU no clock or pin setup is needed; on hardware, enable the USART1 and GPIO clocks and
 * route the pins first (the Crazyflie uses its own drivers). */
#ifndef HOVERFLY_UART_H
#define HOVERFLY_UART_H

#include <stdint.h>

void uart_init(void);                      /* TE, RE, UE on; 115200 baud at 84 MHz APB2 */
void uart_putc(uint8_t byte);              /* waits for TXE, then sends */
void uart_write(const uint8_t *bytes, uint32_t n);
int uart_getc_timeout(uint32_t spins);     /* a byte 0..255, or -1 after `spins` empty polls */
int uart_getc_nonblocking(void);           /* a byte 0..255, or -1 when none is waiting */

#endif
