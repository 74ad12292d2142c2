/* Shim for the firmware header app.h: see crazyflie_api.h. */
#include "crazyflie_api.h"
