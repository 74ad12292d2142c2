/* Shim for the firmware header supervisor.h: see crazyflie_api.h. */
#include "crazyflie_api.h"
