/* Shim for the firmware header debug.h: see crazyflie_api.h. */
#include "crazyflie_api.h"
