/* Host driver for a generated policy (tests and the export's host self-test).
 *   host_main test     -> exit status = policy_test() failures (capped at 100)
 *   host_main obs      stdin: float32 records [POLICY_OBS_SIZE] (state, then the history, newest
 *                      first); stdout: float32 [POLICY_ACTION_SIZE] per record. The history is
 *                      set through the API: reset, then push the actions oldest first.
 *   host_main episode  stdin: float32 records [POLICY_OBS_SIZE] of consecutive steps; the
 *                      history of the first record sets the initial history, then
 *                      policy_control runs on each record's state (its history is ignored:
 *                      the policy keeps its own); stdout: the actions. */
#include <stdio.h>
#include <string.h>

#include "policy.h"

static void set_history(const float obs[POLICY_OBS_SIZE]) {
  policy_reset();
#if POLICY_HISTORY > 0
  for (int k = POLICY_HISTORY - 1; k >= 0; k--) policy_push_action(&obs[POLICY_STATE_SIZE + 4 * k]);
#else
  (void)obs;
#endif
}

static int run_obs(void) {
  float obs[POLICY_OBS_SIZE], action[POLICY_ACTION_SIZE];
  while (fread(obs, sizeof obs, 1, stdin) == 1) {
    set_history(obs);
    policy_evaluate(obs, action);
    if (fwrite(action, sizeof action, 1, stdout) != 1) return 2;
  }
  return 0;
}

static int run_episode(void) {
  float obs[POLICY_OBS_SIZE], action[POLICY_ACTION_SIZE];
  for (int t = 0; fread(obs, sizeof obs, 1, stdin) == 1; t++) {
    if (t == 0) set_history(obs);
    policy_control(obs, action);
    if (fwrite(action, sizeof action, 1, stdout) != 1) return 2;
  }
  return 0;
}

int main(int argc, char **argv) {
  policy_init();
  if (argc == 2 && strcmp(argv[1], "test") == 0) {
    int failures = policy_test();
    return failures > 100 ? 100 : failures;
  }
  if (argc == 2 && strcmp(argv[1], "obs") == 0) return run_obs();
  if (argc == 2 && strcmp(argv[1], "episode") == 0) return run_episode();
  fprintf(stderr, "usage: %s test|obs|episode\n", argv[0]);
  return 2;
}
