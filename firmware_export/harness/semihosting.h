/* ARM semihosting (BKPT 0xAB): console output and exit with a status, for QEMU's
 * -semihosting-config enable=on,target=native. Needs a debugger or QEMU: on a bare board without
 * one, BKPT faults. */
#ifndef HOVERFLY_SEMIHOSTING_H
#define HOVERFLY_SEMIHOSTING_H

void semihosting_write0(const char *text); /* SYS_WRITE0: a NUL-terminated string */
void semihosting_exit(int status) __attribute__((noreturn)); /* SYS_EXIT_EXTENDED */

#endif
