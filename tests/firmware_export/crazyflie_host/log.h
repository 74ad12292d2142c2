/* Shim for the firmware header log.h: see crazyflie_api.h. */
#include "crazyflie_api.h"
