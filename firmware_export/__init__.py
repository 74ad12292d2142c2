"""Firmware export (a later issue): dependency-free C99 for microcontrollers (float and int8), a
bare-metal STM32F405 harness run under QEMU (`netduinoplus2`), and a Crazyflie out-of-tree
controller app."""
