#!/usr/bin/env bash
# test_client_replay.sh for bert_large (a separate test so that each stays
# well inside its time limit on a 2-core machine).
CAP_REPLAY_MODELS=bert_large CAP_REPLAY_NO_DAEMON=0 \
  exec bash "$(dirname "$0")/test_client_replay.sh"
