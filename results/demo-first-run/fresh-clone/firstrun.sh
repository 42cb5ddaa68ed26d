#!/usr/bin/env bash
# The README's first command, pasted verbatim into a fresh clone with a fresh HOME and an empty cache.
# Usage: bash firstrun.sh /path/to/selfspec   (uses /tmp/fc; copies your ~/.config/pip/pip.conf)
set -uo pipefail
R=/tmp/fc; rm -rf $R; mkdir -p $R/home/.config/pip; cp ~/.config/pip/pip.conf $R/home/.config/pip/
git clone -q "${1:?usage: firstrun.sh REPO_URL_OR_PATH}" $R/repo && cd $R/repo && git log --oneline | head -1
CMD=$(python3 - <<'PY'
s=open('README.md').read(); i=s.index('## Set-up'); j=s.index('```bash',i)+8; print(s[j:s.index('```',j)].strip())
PY
)
echo "COMMAND: $CMD"
start=$(date +%s); echo "start $(date -u)"
env -i HOME=$R/home PATH=$PATH PYENV_ROOT=${PYENV_ROOT:-/root/.pyenv} PIP_FIND_LINKS=$PIP_FIND_LINKS PIP_CERT=$PIP_CERT \
  PIP_DEFAULT_TIMEOUT=180 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 LANG=C.UTF-8 \
  bash -c "$CMD"
rc=$?
end=$(date +%s); echo "end $(date -u) rc=$rc wall $((end-start)) s"
