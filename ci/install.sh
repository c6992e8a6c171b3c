#!/usr/bin/env bash
# Install everything slime-submit and its tests need on a fresh Debian machine (Python 3.11).
#   - Debian packages (as root): SLURM + munge for the local test cluster, bubblewrap and libseccomp2 for the
#     agent sandbox, iproute2/procps for network namespaces, tmux for the real-terminal CLI test, zsh and
#     fish for the shell-completion tests. Skipped (with a note) when not root.
#   - A virtualenv at .venv with torch 2.13.0, installed FIRST so that the extras do not resolve it,
#     then the project with its runtime, agent, megatron, test and docs extras.
#     Which torch build: a plain `pip install torch==2.13.0` takes what the machine's package index
#     offers. Our CI machines' pip configuration serves the CPU wheel (2.13.0+cpu); on a stock machine
#     pip resolves from PyPI and gets the multi-GB CUDA build. For the CPU build there, set
#     TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu (passed as --index-url), or install it first:
#       .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(slurmctld slurmd slurm-client munge bubblewrap libseccomp2 iproute2 procps tmux zsh fish chromium chromium-driver)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "ci/install.sh: apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  echo "ci/install.sh: not root (or no apt-get): skipping Debian packages ${APT_PACKAGES[*]};" \
       "SLURM, sandbox, terminal and zsh/fish completion tests will skip with a reason."
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, pinned (see the header for which build the index gives); an installed torch is kept.
.venv/bin/python -c 'import torch' 2>/dev/null ||
  .venv/bin/python -m pip install -q torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
.venv/bin/python -m pip install -q -e '.[runtime,agent,megatron,test,docs]'
echo "ci/install.sh: ready (.venv/bin/slime-submit)"
