#!/usr/bin/env bash
# Smoke test on a GPU machine: start the gateway on a real vLLM-Omni model, talk to it, check the reply.
# Not run in CI (no GPU there). Usage:
#   make omni-venv
#   scripts/gpu-smoke.sh [CONFIG] [WAV]
# CONFIG defaults to configs/qwen3-omni-duplex.yaml, WAV to the test fixture sentence. The model's
# weights must be available to vLLM on that machine. Exits non-zero when no spoken reply comes back.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG=${1:-configs/qwen3-omni-duplex.yaml}
WAV=${2:-tests/fixtures/speech_16k.wav}
PORT=${PORT:-8765}
BIN=.venv-omni/bin
OUT=$(mktemp -d)
LOG="$OUT/gateway.log"

"$BIN/duplex-gateway" serve --config "$CONFIG" --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
GATEWAY=$!
trap 'kill "$GATEWAY" 2>/dev/null || true; wait "$GATEWAY" 2>/dev/null || true' EXIT

# Loading a real model can take minutes.
for _ in $(seq 1 900); do
    if curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null; then break; fi
    if ! kill -0 "$GATEWAY" 2>/dev/null; then echo "gateway exited:"; tail -50 "$LOG"; exit 1; fi
    sleep 1
done
curl -fs "http://127.0.0.1:$PORT/readyz"; echo

for turn in 1 2; do
    "$BIN/duplex-gateway" call "$WAV" --url "ws://127.0.0.1:$PORT/v1/realtime" --out "$OUT/reply-$turn.wav" --timeout 120
done
"$BIN/python" - "$OUT" <<'PY'
import sys, pathlib, soundfile
for path in sorted(pathlib.Path(sys.argv[1]).glob("reply-*.wav")):
    audio, rate = soundfile.read(str(path))
    seconds = len(audio) / rate
    print(f"{path.name}: {seconds:.2f} s, peak {abs(audio).max():.2f}")
    if seconds < 0.5 or abs(audio).max() < 0.01:
        sys.exit(f"{path.name} holds no speech")
PY
echo "replies in $OUT"
