/*
 * Host test driver for the Hoverfly Crazyflie app: plays the firmware's stabilizer loop around
 * the app's controllerOutOfTree() and records what the app does.
 *
 * Linked with -Wl,--wrap=policy_evaluate,--wrap=policy_push_action,--wrap=policy_reset so that
 * every call the app makes into the generated policy is logged (the real function still runs).
 *
 * stdin, one stabilizer tick per line (27 numbers):
 *   step now enable allowed sp_timestamp mode_x mode_y mode_z
 *   sp_px sp_py sp_pz sp_vx sp_vy sp_vz  px py pz  qx qy qz qw  vx vy vz  gx gy gz
 * (now: xTaskGetTickCount() in ms; enable: the hoverfly.enable parameter; allowed: what
 * supervisorAreMotorsAllowedToRun() returns; positions m, velocities m/s, gyro deg/s).
 * stdout, one record per line:
 *   T <controllerOutOfTreeTest()>       once, after controllerOutOfTreeInit()
 *   PARAM <name> <type> <value>         the hoverfly parameter group
 *   LOG <name> <type>                   the hoverfly log group
 *   E <step> <18 state values> <4 actions>   policy_evaluate
 *   P <step> <4 actions>                policy_push_action
 *   R <step>                            policy_reset
 *   M <step> <motor id> <ratio>         motorsSetRatio
 *   C <step> <controlMode> <4 normalizedForces>   control after the call
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "crazyflie_api.h"
#include "policy.h"

extern const struct hostTableEntry hostParams_hoverfly[];
extern const struct hostTableEntry hostLogs_hoverfly[];

static TickType_t now;
static bool motorsAllowed;
static uint32_t step;

TickType_t xTaskGetTickCount(void) { return now; }

void vTaskDelay(const TickType_t xTicksToDelay) { (void)xTicksToDelay; }

bool supervisorAreMotorsAllowedToRun(void) { return motorsAllowed; }

int consolePrintf(const char *format, ...)
{
  va_list args;
  va_start(args, format);
  const int n = vfprintf(stderr, format, args);
  va_end(args);
  return n;
}

void motorsSetRatio(uint32_t id, uint16_t ratio)
{
  printf("M %u %u %u\n", (unsigned)step, (unsigned)id, (unsigned)ratio);
}

void __real_policy_evaluate(const float state[POLICY_STATE_SIZE],
                            float action[POLICY_ACTION_SIZE]);
void __real_policy_push_action(const float action[POLICY_ACTION_SIZE]);
void __real_policy_reset(void);

void __wrap_policy_evaluate(const float state[POLICY_STATE_SIZE],
                            float action[POLICY_ACTION_SIZE])
{
  __real_policy_evaluate(state, action);
  printf("E %u", (unsigned)step);
  for (int i = 0; i < POLICY_STATE_SIZE; i++) {
    printf(" %.9g", (double)state[i]);
  }
  for (int i = 0; i < POLICY_ACTION_SIZE; i++) {
    printf(" %.9g", (double)action[i]);
  }
  printf("\n");
}

void __wrap_policy_push_action(const float action[POLICY_ACTION_SIZE])
{
  __real_policy_push_action(action);
  printf("P %u", (unsigned)step);
  for (int i = 0; i < POLICY_ACTION_SIZE; i++) {
    printf(" %.9g", (double)action[i]);
  }
  printf("\n");
}

void __wrap_policy_reset(void)
{
  __real_policy_reset();
  printf("R %u\n", (unsigned)step);
}

static void *paramAddress(const char *name)
{
  for (const struct hostTableEntry *p = hostParams_hoverfly; p->name != NULL; p++) {
    if (strcmp(p->name, name) == 0) {
      return p->address;
    }
  }
  fprintf(stderr, "no parameter hoverfly.%s\n", name);
  return NULL;
}

static void printTables(void)
{
  for (const struct hostTableEntry *p = hostParams_hoverfly; p->name != NULL; p++) {
    unsigned long value = 0;
    switch (p->type & 0x03) {
      case 0x00: value = *(const uint8_t *)p->address; break;
      case 0x01: value = *(const uint16_t *)p->address; break;
      default: value = *(const uint32_t *)p->address; break;
    }
    printf("PARAM %s %u %lu\n", p->name, (unsigned)p->type, value);
  }
  for (const struct hostTableEntry *p = hostLogs_hoverfly; p->name != NULL; p++) {
    printf("LOG %s %u\n", p->name, (unsigned)p->type);
  }
}

int main(void)
{
  controllerOutOfTreeInit();
  printf("T %d\n", controllerOutOfTreeTest() ? 1 : 0);
  printTables();
  uint8_t *enable = paramAddress("enable");
  if (enable == NULL) {
    return 1;
  }

  control_t control;
  memset(&control, 0, sizeof(control));
  for (;;) {
    unsigned s, t, en, allowed, spTimestamp;
    int mode[3];
    float f[19];
    const int n = scanf("%u %u %u %u %u %d %d %d "
                        "%f %f %f %f %f %f %f %f %f %f %f %f %f %f %f %f %f %f %f",
                        &s, &t, &en, &allowed, &spTimestamp, &mode[0], &mode[1], &mode[2], &f[0],
                        &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9], &f[10],
                        &f[11], &f[12], &f[13], &f[14], &f[15], &f[16], &f[17], &f[18]);
    if (n != 27) {
      return n == EOF ? 0 : 2;
    }
    step = s;
    now = t;
    *enable = (uint8_t)en;
    motorsAllowed = allowed != 0;

    setpoint_t setpoint;
    sensorData_t sensors;
    state_t state;
    memset(&setpoint, 0, sizeof(setpoint));
    memset(&sensors, 0, sizeof(sensors));
    memset(&state, 0, sizeof(state));
    setpoint.timestamp = spTimestamp;
    setpoint.mode.x = (stab_mode_t)mode[0];
    setpoint.mode.y = (stab_mode_t)mode[1];
    setpoint.mode.z = (stab_mode_t)mode[2];
    setpoint.position.x = f[0];
    setpoint.position.y = f[1];
    setpoint.position.z = f[2];
    setpoint.velocity.x = f[3];
    setpoint.velocity.y = f[4];
    setpoint.velocity.z = f[5];
    state.position.x = f[6];
    state.position.y = f[7];
    state.position.z = f[8];
    state.attitudeQuaternion.x = f[9];
    state.attitudeQuaternion.y = f[10];
    state.attitudeQuaternion.z = f[11];
    state.attitudeQuaternion.w = f[12];
    state.velocity.x = f[13];
    state.velocity.y = f[14];
    state.velocity.z = f[15];
    sensors.gyro.x = f[16];
    sensors.gyro.y = f[17];
    sensors.gyro.z = f[18];

    controllerOutOfTree(&control, &setpoint, &sensors, &state, step);
    printf("C %u %d", (unsigned)step, (int)control.controlMode);
    for (int i = 0; i < STABILIZER_NR_OF_MOTORS; i++) {
      printf(" %.9g", (double)control.normalizedForces[i]);
    }
    printf("\n");
  }
}
