# Sourced by the demo and the tests: the lab's API key lives only in the controller's environment.
# A person's own VLLM_API_KEY wins; otherwise one is generated once and kept 0600 in .cache/.
if [ -z "${VLLM_API_KEY:-}" ]; then
  mkdir -p .cache
  if [ ! -s .cache/lab-api-key ]; then
    (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > .cache/lab-api-key)
  fi
  VLLM_API_KEY=$(cat .cache/lab-api-key)
  export VLLM_API_KEY
fi
# The lab's machines reach PyPI only; torch's CPU build comes from the local folder pip is configured
# with (pip config list), so the variant's public indexes (download.pytorch.org) are skipped.
export VLLM_FLEET_VARIANT_INDEXES=${VLLM_FLEET_VARIANT_INDEXES:-0}
# ...and the controller finds that CPU torch in the folder pip is configured with, for CPU builds
export VLLM_FLEET_FIND_LINKS=${VLLM_FLEET_FIND_LINKS:-$(pip config get global.find-links 2>/dev/null || true)}
