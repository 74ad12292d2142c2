/* Shim for the firmware header param.h: see crazyflie_api.h. */
#include "crazyflie_api.h"
