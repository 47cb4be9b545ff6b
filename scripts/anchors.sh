#!/usr/bin/env bash
# anchors.sh — install and run two third-party LLM gateways ("anchors") in front of an
# OpenAI-compatible backend, so a benchmark can measure the latency each one adds.
#
# Usage:
#   anchors.sh install VENV_DIR                      # venv + pinned packages (idempotent)
#   anchors.sh litellm VENV_DIR BACKEND_URL PORT     # exec LiteLLM proxy on 127.0.0.1:PORT
#   anchors.sh smg     VENV_DIR BACKEND_URL PORT     # exec SGLang Model Gateway on 127.0.0.1:PORT
#
# BACKEND_URL is the backend's OpenAI base, with or without a trailing /v1
# (http://127.0.0.1:1234/v1 and http://127.0.0.1:1234 are treated alike). The backend must
# answer POST /v1/chat/completions (JSON, and SSE ending in `data: [DONE]` for stream:true);
# LiteLLM also sends GET /v1/models once at start (a 404 there is harmless).
#
# Pinned versions (Python 3.11; every transitive dependency is frozen below as constraints):
#   litellm[proxy]==1.106.12   (1.104.9 and 1.108.14..1.110.2 did not resolve here: their
#                               proxy extra pins litellm-proxy(-extras) builds not on PyPI)
#   smg==1.13.0                (SGLang/"Shepherd" Model Gateway: Rust router in an abi3 wheel)
#
# Readiness (poll until it answers HTTP 200):
#   litellm: GET http://127.0.0.1:PORT/health/readiness  -> {"status":"healthy","db":"Not connected"}
#            (takes ~5-10 s after start: heavy Python imports)
#   smg:     GET http://127.0.0.1:PORT/readiness         -> {"status":"ready","healthy_workers":1,...}
#            (under ~0.5 s; 503 until the worker is registered). Neither readiness URL
#            contacts the backend: with health checks off smg is "ready" even when the
#            backend is down (requests then get 503 upstream_error); start the backend first.
#   smg also binds a Prometheus port (127.0.0.1, a free port picked at start).
#
# Request shape (both: POST http://127.0.0.1:PORT/v1/chat/completions,
#                Content-Type: application/json, "stream": true|false):
#   litellm: "model":"gyre-test" exactly (any other name -> 400 "Invalid model name").
#            Header `Authorization: Bearer $LITELLM_MASTER_KEY` is REQUIRED (default key
#            sk-gyre-anchor; a wrong key -> 400 "No connected db.", no header -> 500).
#            LiteLLM 1.106 refuses to start without a master key, so one is always set.
#            /chat/completions (no /v1) works too. It calls the backend with its own key
#            (`Authorization: Bearer sk-gyre-anchor`), adds stream_options.include_usage on
#            streamed requests, and re-serialises the body.
#   smg:     "model" is required but any value is accepted (wildcard worker; the name is passed
#            through unchanged). No auth required; an Authorization header, if sent, is
#            forwarded to the backend verbatim. The body is parsed and re-serialised.
#   Sending `Authorization: Bearer sk-gyre-anchor` and model gyre-test works for both (and
#   for the backend directly).
#
# Backend quirk: smg keeps pooled keep-alive connections to the backend; a backend that
# writes response headers and body in separate small writes without TCP_NODELAY gets
# ~40 ms Nagle/delayed-ACK stalls per request behind smg (seen with Python http.server).
#
# Env knobs: LITELLM_MASTER_KEY (litellm client key, default sk-gyre-anchor),
#            SMG_POLICY (default round_robin), PYTHON (interpreter for the venv, default python3).
set -euo pipefail

LITELLM_VERSION=1.106.12
SMG_VERSION=1.13.0
STAMP_NAME=.gyre-anchors-stamp
STAMP_VALUE="litellm[proxy]==${LITELLM_VERSION} smg==${SMG_VERSION} constraints-v1"

die() { echo "anchors.sh: $*" >&2; exit 2; }

usage() {
  sed -n '2,9p' "$0" >&2
  exit 2
}

# Backend base without trailing slash and without a trailing /v1.
backend_root() {
  local u="${1%/}"
  u="${u%/v1}"
  printf '%s' "${u%/}"
}

check_port() {
  [[ "$1" =~ ^[0-9]+$ ]] && (( $1 > 0 && $1 < 65536 )) || die "bad port: $1"
}

write_constraints() {
  cat > "$1" <<'CONSTRAINTS'
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
APScheduler==3.11.3
attrs==26.1.0
azure-core==1.41.0
azure-identity==1.27.0
azure-storage-blob==12.31.1
backoff==2.2.1
boto3==1.44.8
botocore==1.44.8
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
click==8.5.1
croniter==7.0.0
cryptography==50.0.2
distro==1.9.0
dnspython==2.9.2
email-validator==2.4.0
Expression==5.8.0
fastapi==0.165.0
fastapi-sso==0.23.0
fastuuid==0.14.0
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
granian==2.8.9
grpcio==1.85.3
grpcio-health-checking==1.85.1
gunicorn==23.0.0
h11==0.16.0
h2==4.4.1
hf-xet==1.8.0
hiredis==3.5.0
hpack==4.2.0
httpcore==1.0.9
httpcore2==2.16.2
httpx==0.29.0
httpx2==2.16.2
huggingface_hub==1.33.0
hyperframe==6.1.0
idna==3.20
importlib_metadata==8.9.0
inquirerpy==0.3.4
isodate==0.7.2
Jinja2==3.1.6
jiter==0.19.0
jmespath==1.1.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
litellm==1.106.12
litellm-enterprise==0.1.76.post1
litellm-proxy-extras==0.4.108
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mcp==2.3.0
mcp-types==2.3.0
mdurl==0.1.2
msal==1.39.0
msal-extensions==1.3.1
multidict==7.2.1
numpy==2.4.6
oauthlib==4.0.1
openai==2.54.0
opentelemetry-api==1.45.2
orjson==3.13.0
packaging==26.4
pfzy==0.3.4
polars==1.44.2
polars-runtime-32==1.44.2
prompt_toolkit==3.0.53
propcache==0.5.4
protobuf==7.36.2
psycopg==3.3.9
psycopg-binary==3.3.9
pycparser==3.12
pydantic==2.14.4
pydantic-settings==2.16.3
pydantic_core==2.50.5
Pygments==2.21.0
PyJWT==2.15.1
PyNaCl==1.6.2
pyroscope-io==0.8.16
python-dateutil==2.9.0.post0
python-dotenv==1.2.4
python-multipart==0.0.34
PyYAML==6.0.4
redis==8.1.0
referencing==0.37.0
regex==2026.11.19
requests==2.34.2
RestrictedPython==8.5
rich==13.9.4
rpds-py==2026.9.1
rq==2.12.0
s3transfer==0.19.3
setproctitle==1.3.8
six==1.17.0
smg==1.13.0
sniffio==1.3.1
soundfile==0.14.0
sse-starlette==3.7.1
starlette==1.10.0
tiktoken==0.14.0
tokenizers==0.23.3
tomlkit==0.15.2
tqdm==4.70.1
truststore==0.10.5
typing-inspection==0.4.5
typing_extensions==4.16.0
tzlocal==5.4.5
urllib3==2.8.0
uvicorn==0.55.0
uvloop==0.23.0
wcwidth==0.9.4
websockets==15.0.1
yarl==1.25.1
zipp==4.1.2
CONSTRAINTS
}

installed_ok() {
  local venv="$1"
  [[ -x "$venv/bin/python" && -x "$venv/bin/litellm" && -x "$venv/bin/smg" ]] || return 1
  [[ -f "$venv/$STAMP_NAME" && "$(cat "$venv/$STAMP_NAME")" == "$STAMP_VALUE" ]] || return 1
  "$venv/bin/python" - "$LITELLM_VERSION" "$SMG_VERSION" <<'PYCHECK' >/dev/null 2>&1
import sys, importlib.metadata as m
assert m.version("litellm") == sys.argv[1]
assert m.version("smg") == sys.argv[2]
m.version("fastapi"); m.version("uvicorn")  # proxy extra present
PYCHECK
}

cmd_install() {
  local venv="$1"
  if installed_ok "$venv"; then
    echo "anchors: $venv already has litellm==$LITELLM_VERSION smg==$SMG_VERSION"
    return 0
  fi
  local py="${PYTHON:-python3}"
  [[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
  local tmp
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/gyre-anchors-install.XXXXXX")"
  write_constraints "$tmp/constraints.txt"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install -q \
    -c "$tmp/constraints.txt" \
    "litellm[proxy]==${LITELLM_VERSION}" "smg==${SMG_VERSION}"
  rm -rf "$tmp"
  printf '%s' "$STAMP_VALUE" > "$venv/$STAMP_NAME"
  installed_ok "$venv" || die "install finished but the version check failed in $venv"
  echo "anchors: installed litellm==$LITELLM_VERSION smg==$SMG_VERSION into $venv"
}

abs_dir() {
  [[ -d "$1" ]] || die "no such venv: $1 (run: anchors.sh install $1)"
  (cd "$1" && pwd)
}

cmd_litellm() {
  local venv backend port="$3"
  venv="$(abs_dir "$1")"
  backend="$(backend_root "$2")"
  check_port "$port"
  [[ -x "$venv/bin/litellm" ]] || die "no litellm in $venv (run: $0 install $venv)"
  local dir
  dir="$(mktemp -d "${TMPDIR:-/tmp}/gyre-anchor-litellm.XXXXXX")"
  cat > "$dir/config.yaml" <<YAML
model_list:
  - model_name: gyre-test
    litellm_params:
      model: openai/gyre-test
      api_base: ${backend}/v1
      api_key: sk-gyre-anchor
litellm_settings:
  set_verbose: false
  turn_off_message_logging: true
  request_timeout: 600
general_settings:
  master_key: os.environ/LITELLM_MASTER_KEY
  disable_spend_logs: true
  disable_error_logs: true
YAML
  # (the small temp dir stays behind after exec; it holds only this config)
  cd "$dir"  # no stray .env is picked up (PRODUCTION mode skips dotenv anyway)
  # No DATABASE_URL/REDIS: no DB. Offline cost map (else it retries GitHub at start),
  # warning-level logs, one uvicorn worker. (--telemetry is a no-op in this version.)
  unset DATABASE_URL DIRECT_URL REDIS_HOST REDIS_URL
  export LITELLM_MASTER_KEY="${LITELLM_MASTER_KEY:-sk-gyre-anchor}"
  export LITELLM_MODE=PRODUCTION
  export LITELLM_LOG=WARNING
  export LITELLM_LOCAL_MODEL_COST_MAP=True
  export LITELLM_DONT_SHOW_FEEDBACK_BOX=True
  export DISABLE_ADMIN_UI=True
  export HF_HUB_OFFLINE=1
  exec "$venv/bin/litellm" --config "$dir/config.yaml" \
    --host 127.0.0.1 --port "$port" --num_workers 1
}

free_port() {
  "$1/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

cmd_smg() {
  local venv backend port="$3"
  venv="$(abs_dir "$1")"
  backend="$(backend_root "$2")"
  check_port "$port"
  [[ -x "$venv/bin/smg" ]] || die "no smg in $venv (run: $0 install $venv)"
  # smg always serves Prometheus metrics on a second port (default 0.0.0.0:29000, cannot be
  # turned off): bind it to loopback on a free port so parallel runs do not collide.
  local metrics_port
  metrics_port="$(free_port "$venv")"
  # --backend openai: plain OpenAI-compatible HTTP worker (no tokenizer, no sglang engine);
  #   the worker URL is the root WITHOUT /v1 (smg appends /v1/chat/completions itself).
  # --disable-health-check: otherwise smg may probe GET /health on the worker (every 60 s),
  #   which a plain OpenAI server may lack, and mark it unhealthy. --disable-load-monitoring: no polling of /loads, /v1/loads.
  # --policy round_robin: one worker, so cache-aware prefix trees would be pure overhead.
  exec "$venv/bin/smg" launch \
    --backend openai \
    --worker-urls "$backend" \
    --host 127.0.0.1 --port "$port" \
    --policy "${SMG_POLICY:-round_robin}" \
    --disable-health-check \
    --disable-load-monitoring \
    --disable-tokenizer-autoload \
    --log-level warn \
    --prometheus-host 127.0.0.1 --prometheus-port "$metrics_port" \
    --shutdown-grace-period-secs 1
}

[[ $# -ge 1 ]] || usage
sub="$1"; shift
case "$sub" in
  install) [[ $# -eq 1 ]] || usage; cmd_install "$1" ;;
  litellm) [[ $# -eq 3 ]] || usage; cmd_litellm "$1" "$2" "$3" ;;
  smg)     [[ $# -eq 3 ]] || usage; cmd_smg "$1" "$2" "$3" ;;
  *) usage ;;
esac
