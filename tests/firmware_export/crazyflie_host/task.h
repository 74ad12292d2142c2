/* Shim for the firmware header task.h: see crazyflie_api.h. */
#include "crazyflie_api.h"
