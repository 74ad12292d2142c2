/* Shim for the firmware header controller.h: see crazyflie_api.h. */
#include "crazyflie_api.h"
