/* Shim for the firmware header motors.h: see crazyflie_api.h. */
#include "crazyflie_api.h"
