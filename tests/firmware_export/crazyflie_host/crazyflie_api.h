/*
 * The slice of the Crazyflie firmware's public API that the Hoverfly app uses, for compiling the
 * app's own C on a host (and with arm-none-eabi-gcc) without the firmware, which needs its git
 * submodules to build. Written from bitcraze/crazyflie-firmware:
 *   src/modules/interface/stabilizer_types.h   (stabilizerStep_t, attitude_t, vec3_s/point_t,
 *       quaternion_t, sensorData_t, state_t, control_t + control_mode_t, setpoint_t + modes,
 *       STABILIZER_NR_OF_MOTORS, RATE_* and RATE_DO_EXECUTE)
 *   src/hal/interface/imu_types.h               (Axis3f)
 *   src/drivers/interface/motors.h              (MOTOR_M1..M4, motorsSetRatio)
 *   src/modules/interface/controller/controller.h (the out-of-tree controller functions)
 *   src/modules/interface/supervisor.h          (supervisorAreMotorsAllowedToRun)
 *   src/config/FreeRTOSConfig.h, FreeRTOS task.h (TickType_t, M2T, xTaskGetTickCount, vTaskDelay)
 *   src/modules/interface/param.h, log.h        (type codes; the group macros build a plain table
 *       here, the firmware puts the same entries into linker sections)
 *   src/utils/interface/debug.h                 (DEBUG_PRINT -> consolePrintf)
 * The firmware headers the app includes by name (app.h, controller.h, ...) are one-line shims in
 * this folder that include this file. The test driver (test_driver.c) defines the functions.
 */
#ifndef HOVERFLY_CRAZYFLIE_API_H
#define HOVERFLY_CRAZYFLIE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- FreeRTOS (configTICK_RATE_HZ = 1000: one tick per millisecond) ---- */
typedef uint32_t TickType_t;
#define configTICK_RATE_HZ ((TickType_t)1000)
#define M2T(X) ((unsigned int)(X))
#define T2M(X) ((unsigned int)(X))
TickType_t xTaskGetTickCount(void);
void vTaskDelay(const TickType_t xTicksToDelay);

/* ---- imu_types.h ---- */
typedef union {
  struct {
    float x;
    float y;
    float z;
  };
  float axis[3];
} Axis3f;

/* ---- stabilizer_types.h ---- */
typedef uint32_t stabilizerStep_t;

typedef struct attitude_s {
  uint32_t timestamp;
  float roll;
  float pitch;
  float yaw;
} attitude_t;

struct vec3_s {
  uint32_t timestamp;
  float x;
  float y;
  float z;
};
typedef struct vec3_s vector_t;
typedef struct vec3_s point_t;
typedef struct vec3_s velocity_t;
typedef struct vec3_s acc_t;

typedef struct quaternion_s {
  union {
    struct {
      float q0;
      float q1;
      float q2;
      float q3;
    };
    struct {
      float x;
      float y;
      float z;
      float w;
    };
  };
} quaternion_t;

typedef struct baro_s {
  float pressure;
  float temperature;
  float asl;
} baro_t;

typedef struct sensorData_s {
  Axis3f acc;  /* Gs */
  Axis3f gyro; /* deg/s */
  Axis3f mag;  /* gauss */
  baro_t baro;
  uint64_t interruptTimestamp;
} sensorData_t;

typedef struct state_s {
  attitude_t attitude; /* deg (legacy CF2 body coordinate system, where pitch is inverted) */
  quaternion_t attitudeQuaternion;
  point_t position;    /* m */
  velocity_t velocity; /* m/s */
  acc_t acc;           /* Gs (but acc.z without considering gravity) */
} state_t;

#define STABILIZER_NR_OF_MOTORS 4

typedef enum control_mode_e {
  controlModeLegacy = 0,
  controlModeForceTorque = 1,
  controlModeForce = 2,
} control_mode_t;

typedef struct control_s {
  union {
    struct {
      int16_t roll;
      int16_t pitch;
      int16_t yaw;
      float thrust;
    };
    struct {
      float thrustSi;
      union {
        float torque[3];
        struct {
          float torqueX;
          float torqueY;
          float torqueZ;
        };
      };
    };
    float normalizedForces[STABILIZER_NR_OF_MOTORS]; /* 0.0 ... 1.0 */
  };
  control_mode_t controlMode;
} control_t;

typedef enum mode_e {
  modeDisable = 0,
  modeAbs,
  modeVelocity
} stab_mode_t;

typedef struct setpoint_s {
  uint32_t timestamp;
  attitude_t attitude;     /* deg */
  attitude_t attitudeRate; /* deg/s */
  quaternion_t attitudeQuaternion;
  float thrust;
  point_t position;    /* m */
  velocity_t velocity; /* m/s */
  acc_t acceleration;  /* m/s^2 */
  bool velocity_body;
  struct {
    stab_mode_t x;
    stab_mode_t y;
    stab_mode_t z;
    stab_mode_t roll;
    stab_mode_t pitch;
    stab_mode_t yaw;
    stab_mode_t quat;
  } mode;
} setpoint_t;

#define RATE_1000_HZ 1000
#define RATE_500_HZ 500
#define RATE_250_HZ 250
#define RATE_100_HZ 100
#define RATE_50_HZ 50
#define RATE_25_HZ 25
#define RATE_MAIN_LOOP RATE_1000_HZ
#define RATE_DO_EXECUTE(RATE_HZ, TICK) ((TICK % (RATE_MAIN_LOOP / RATE_HZ)) == 0)

/* ---- motors.h ---- */
#define NBR_OF_MOTORS 4
#define MOTOR_M1 0
#define MOTOR_M2 1
#define MOTOR_M3 2
#define MOTOR_M4 3
void motorsSetRatio(uint32_t id, uint16_t ratio);

/* ---- controller.h (CONFIG_CONTROLLER_OOT) ---- */
void controllerOutOfTreeInit(void);
bool controllerOutOfTreeTest(void);
void controllerOutOfTree(control_t *control, const setpoint_t *setpoint,
                         const sensorData_t *sensors, const state_t *state,
                         const stabilizerStep_t stabilizerStep);

/* ---- supervisor.h ---- */
bool supervisorAreMotorsAllowedToRun(void);

/* ---- app.h ---- */
void appMain(void);

/* ---- debug.h ---- */
int consolePrintf(const char *format, ...) __attribute__((format(printf, 1, 2)));
#define DEBUG_PRINT(fmt, ...) consolePrintf("[" DEBUG_MODULE "]: " fmt, ##__VA_ARGS__)

/* ---- param.h / log.h: the firmware's type codes; each group becomes a readable table ---- */
#define PARAM_1BYTE 0x00
#define PARAM_2BYTES 0x01
#define PARAM_4BYTES 0x02
#define PARAM_TYPE_INT (0x00 << 2)
#define PARAM_TYPE_FLOAT (0x01 << 2)
#define PARAM_SIGNED (0x00 << 3)
#define PARAM_UNSIGNED (0x01 << 3)
#define PARAM_RONLY (1 << 6)
#define PARAM_UINT8 (PARAM_1BYTE | PARAM_TYPE_INT | PARAM_UNSIGNED)
#define PARAM_UINT16 (PARAM_2BYTES | PARAM_TYPE_INT | PARAM_UNSIGNED)
#define PARAM_UINT32 (PARAM_4BYTES | PARAM_TYPE_INT | PARAM_UNSIGNED)
#define PARAM_FLOAT (PARAM_4BYTES | PARAM_TYPE_FLOAT | PARAM_SIGNED)

#define LOG_UINT8 1
#define LOG_UINT16 2
#define LOG_UINT32 3
#define LOG_FLOAT 7

struct hostTableEntry {
  uint8_t type;
  const char *name;
  void *address;
};

#define PARAM_GROUP_START(NAME) \
  const struct hostTableEntry hostParams_##NAME[] = {
#define PARAM_ADD(TYPE, NAME, ADDRESS) {(TYPE), #NAME, (void *)(ADDRESS)},
#define PARAM_GROUP_STOP(NAME) \
  {0, NULL, NULL}             \
  };

#define LOG_GROUP_START(NAME) \
  const struct hostTableEntry hostLogs_##NAME[] = {
#define LOG_ADD(TYPE, NAME, ADDRESS) {(TYPE), #NAME, (void *)(ADDRESS)},
#define LOG_GROUP_STOP(NAME) \
  {0, NULL, NULL}           \
  };

#endif /* HOVERFLY_CRAZYFLIE_API_H */
