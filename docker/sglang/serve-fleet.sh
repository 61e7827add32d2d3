#!/usr/bin/env bash
# One SGLang server per GPU plus an sglang-router in front: the fleet eagle-data attaches to.
# Settings come from the environment (defaults: the tuned 7 x B200 run, see README.md):
#   MODEL_PATH   model to serve (required)
#   NUM_GPUS     servers to start, one per GPU (default: every GPU nvidia-smi lists)
#   BASE_PORT    first server port (default 30001); server i listens on BASE_PORT + i
#   ROUTER_PORT  the router's port (default 30000); give eagle-data http://<host>:ROUTER_PORT
#   SGLANG_ARGS  extra server flags (default: --mem-fraction-static 0.93 --max-running-requests 64
#                --max-mamba-cache-size 200; the last one only matters for hybrid Mamba models)
#   ROUTER_ARGS  extra router flags (default: --policy cache_aware)
#   HEALTH_TIMEOUT_S  how long a server may take to load (default 1800)
set -euo pipefail

: "${MODEL_PATH:?set MODEL_PATH to the model to serve}"
NUM_GPUS="${NUM_GPUS:-$(nvidia-smi -L | wc -l)}"
BASE_PORT="${BASE_PORT:-30001}"
ROUTER_PORT="${ROUTER_PORT:-30000}"
SGLANG_ARGS="${SGLANG_ARGS:---mem-fraction-static 0.93 --max-running-requests 64 --max-mamba-cache-size 200}"
ROUTER_ARGS="${ROUTER_ARGS:---policy cache_aware}"
HEALTH_TIMEOUT_S="${HEALTH_TIMEOUT_S:-1800}"
LOG_DIR="${LOG_DIR:-/tmp/sglang-logs}"
mkdir -p "$LOG_DIR"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM

urls=()
for ((i = 0; i < NUM_GPUS; i++)); do
  port=$((BASE_PORT + i))
  # shellcheck disable=SC2086  # SGLANG_ARGS is a list of flags
  CUDA_VISIBLE_DEVICES=$i python3 -m sglang.launch_server --model-path "$MODEL_PATH" \
    --host 0.0.0.0 --port "$port" $SGLANG_ARGS >"$LOG_DIR/server-$port.log" 2>&1 &
  pids+=($!)
  urls+=("http://127.0.0.1:$port")
done

deadline=$((SECONDS + HEALTH_TIMEOUT_S))
for ((i = 0; i < NUM_GPUS; i++)); do
  until curl -sf "${urls[$i]}/health" >/dev/null; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null || ((SECONDS > deadline)); then
      echo "server ${urls[$i]} did not become healthy; last log lines:" >&2
      tail -n 20 "$LOG_DIR/server-$((BASE_PORT + i)).log" >&2
      exit 1
    fi
    sleep 5
  done
  echo "healthy: ${urls[$i]}"
done

# shellcheck disable=SC2086
python3 -m sglang_router.launch_router --worker-urls "${urls[@]}" --host 0.0.0.0 --port "$ROUTER_PORT" \
  $ROUTER_ARGS &
router=$!
pids+=("$router")
echo "router on :$ROUTER_PORT in front of ${NUM_GPUS} servers"
# A server that dies later is the router's (and eagle-data's failover's) business; the fleet stops with the router.
wait "$router"
