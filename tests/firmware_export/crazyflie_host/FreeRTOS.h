/* Shim for the firmware header FreeRTOS.h: see crazyflie_api.h. */
#include "crazyflie_api.h"
